"""Registration refuses tables that could run forever, or that name what they do not declare."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from eventbus import Bus, DefinitionError
from eventbus.errors import UncappedCycle, UndeclaredState, UnreachableState
from eventbus.workflows import Machine, StepContext


class C(msgspec.Struct):
    key: str


async def _noop(c: C, ctx: StepContext) -> None:
    return None


def table(
    *rows: tuple[str, str, str, dict[str, object]], terminals: tuple[str, ...] = ("DONE",)
) -> Machine[C]:
    m = Machine("t", checkpoint=C, key=lambda c: c.key)
    for i, (name, ok, fail, options) in enumerate(rows):
        m.state(on_success=ok, on_failure=fail, initial=i == 0, name=name, **options)(_noop)  # type: ignore[arg-type]
    for t in terminals:
        m.terminal(t)
    return m


def test_a_cycle_through_uncapped_states_is_refused() -> None:
    m = table(("A", "B", "DONE", {}), ("B", "A", "DONE", {}))
    with pytest.raises(UncappedCycle, match="A -> B -> A"):
        Bus("sqlite:///unused.db").include(m)


def test_a_self_loop_needs_a_cap_and_a_capped_state_breaks_the_cycle() -> None:
    with pytest.raises(UncappedCycle, match="P -> P"):
        table(("P", "DONE", "P", {})).check()
    table(("P", "DONE", "P", {"max_visits": 3})).check()
    table(("A", "B", "DONE", {}), ("B", "A", "DONE", {"max_age": timedelta(hours=1)})).check()


def test_a_run_age_cap_bounds_every_cycle() -> None:
    m = Machine("t", checkpoint=C, key=lambda c: c.key, max_age=timedelta(hours=5))
    m.state(initial=True, on_success="A", on_failure="A", name="A")(_noop)
    m.check()


def test_an_edge_to_an_undeclared_state_is_refused() -> None:
    with pytest.raises(UndeclaredState, match="'NOPE'"):
        table(("A", "NOPE", "DONE", {})).check()
    with pytest.raises(UndeclaredState, match="'ELSEWHERE'"):
        table(("A", "DONE", "DONE", {"also": ("ELSEWHERE",)})).check()


def test_an_unreachable_state_is_refused() -> None:
    with pytest.raises(UnreachableState, match="ORPHAN"):
        table(("A", "DONE", "DONE", {}), ("ORPHAN", "DONE", "DONE", {})).check()
    with pytest.raises(UnreachableState, match="NEVER"):
        table(("A", "DONE", "DONE", {}), terminals=("DONE", "NEVER")).check()


def test_other_table_mistakes_are_typed() -> None:
    with pytest.raises(DefinitionError, match="no poll, wake_on or children"):
        table(("A", "DONE", "DONE", {"continue_run": False})).check()
    with pytest.raises(DefinitionError, match="exactly one initial"):
        Machine("t", checkpoint=C, key=lambda c: c.key).check()
    with pytest.raises(DefinitionError, match="already has a state"):
        table(("A", "DONE", "DONE", {}), terminals=("DONE", "A"))
    with pytest.raises(DefinitionError, match="already has a state"):
        table(("MAX_RETRIES", "DONE", "DONE", {}))
