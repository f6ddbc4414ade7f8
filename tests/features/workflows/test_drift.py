"""`workflow check`: live instances against a changed definition, and renamed states."""

from __future__ import annotations

import logging
from dataclasses import replace

import msgspec
import pytest

from eventbus import Bus, DefinitionError
from eventbus.errors import UndeclaredState
from eventbus.workflows import Machine, StepContext, TableChange, Yield
from eventbus.workflows._drift import diff

from ...conftest import BusFactory
from ._support import finish, run_until, status_is


class D(msgspec.Struct):
    key: str
    ran: list[str] = []


def version(state: str, **options: object) -> Machine[D]:
    m = Machine("drift", checkpoint=D, key=lambda c: c.key, **options)  # type: ignore[arg-type]

    async def body(c: D, ctx: StepContext) -> Yield | None:
        c.ran.append(ctx.state)
        return Yield() if ctx.state == "OLD" else None

    m.state(initial=True, on_success="DONE", on_failure="DONE", continue_run=False, poll=0.2,
            max_visits=50, name=state)(body)  # fmt: skip
    m.terminal("DONE")
    return m


async def test_check_finds_instances_in_states_that_are_gone_and_renamed_maps_them(
    make_bus: BusFactory,
) -> None:
    old: Bus = await make_bus()
    v1 = version("OLD")
    old.include(v1)
    await old.workflows.start(v1, D(key="d1"))
    await run_until(old, lambda: status_is(old, v1, "d1", "waiting"))
    assert await old.workflows.check(v1) == []

    new: Bus = await make_bus()
    new.include(version("NEW"))
    (problem,) = await new.workflows.check("drift")
    assert "1 waiting instance(s) of drift are in OLD" in problem

    mapped: Bus = await make_bus()
    v3 = version("NEW", renamed={"OLD": "NEW"})
    mapped.include(v3)
    assert await mapped.workflows.check(v3) == []
    await finish(mapped, v3, ["d1"])
    inst = await mapped.workflows.instance(v3, "d1")
    assert inst.state == "DONE" and inst.checkpoint.ran[-1] == "NEW"


def shaped(change: str = "", **options: object) -> Machine[D]:
    """START -> HOLD (yields) -> DONE; ``change`` edits the table as a deploy would."""
    m = Machine("shape", checkpoint=D, key=lambda c: c.key, **options)  # type: ignore[arg-type]
    hold = "KEEP" if change in ("removed", "renamed") else "HOLD"

    async def body(c: D, ctx: StepContext) -> Yield | None:
        c.ran.append(ctx.state)
        return Yield() if ctx.state in ("HOLD", "KEEP") and c.key != "go" else None

    m.state(initial=True, on_success=hold, on_failure="DONE", name="START")(body)
    failure = "RETRY" if change == "edges" else "DONE"
    m.state(on_success="DONE", on_failure=failure, continue_run=False, poll=0.2, max_visits=50,
            name=hold)(body)  # fmt: skip
    if change == "edges":
        m.state(on_success=hold, on_failure="DONE", max_visits=3, name="RETRY")(body)
    m.terminal("DONE")
    return m


async def recorded(bus: Bus, m: Machine[D]) -> bool:
    return (await bus.workflows.changes(m)).stored_hash == m.def_hash


def test_the_hash_is_the_shape_of_the_table() -> None:
    assert shaped().def_hash == shaped().def_hash
    assert shaped().definition()["states"]["HOLD"] == {
        "edges": {"DONE": "success, failure"}, "initial": False, "continue_run": False,
    }  # fmt: skip
    other_caps = shaped()
    other_caps.states["HOLD"] = replace(other_caps.states["HOLD"], max_visits=7, poll=9.0, timeout=1.0)
    assert other_caps.def_hash == shaped().def_hash, "caps, polls and timeouts are not the shape"
    assert len({shaped().def_hash, shaped("edges").def_hash, shaped("removed").def_hash}) == 3


def test_the_diff_names_what_changed() -> None:
    before = shaped().definition()
    edges = diff(before, shaped("edges").definition(), {})
    assert edges.added == ("RETRY",) and edges.removed == () and edges.renamed == ()
    assert [str(c) for c in edges.changed] == [
        "HOLD: success, failure DONE [yields] -> success DONE, failure RETRY [yields]"
    ]
    gone = diff(before, shaped("removed").definition(), {})
    assert (gone.added, gone.removed) == (("KEEP",), ("HOLD",))
    assert [c.state for c in gone.changed] == ["START"], "START's success edge moved to KEEP"
    moved = diff(before, shaped("renamed").definition(), {"HOLD": "KEEP"})
    assert (moved.added, moved.removed, moved.renamed) == ((), (), (("HOLD", "KEEP"),))
    assert diff(before, shaped().definition(), {}) == TableChange() and not TableChange()


def test_a_rename_must_lead_from_a_gone_state_to_a_declared_one() -> None:
    with pytest.raises(UndeclaredState, match="renames HOLD to 'NOPE'"):
        shaped("removed", renamed={"HOLD": "NOPE"}).check()
    with pytest.raises(DefinitionError, match="still has a state START"):
        shaped("removed", renamed={"START": "KEEP"}).check()


async def test_a_changed_table_is_reported_before_and_at_start_up_then_in_force(
    make_bus: BusFactory, caplog: pytest.LogCaptureFixture
) -> None:
    old: Bus = await make_bus()
    v1 = shaped()
    old.include(v1)
    await old.workflows.start(v1, D(key="d1"))
    await run_until(old, lambda: status_is(old, v1, "d1", "waiting"))
    same = await old.workflows.changes(v1)
    assert (same.stored_hash, same.changed, same.live, same.lines()) == (v1.def_hash, False, (), [])

    new: Bus = await make_bus()
    v2 = shaped("edges")
    new.include(v2)
    report = await new.workflows.changes(v2)
    assert report.changed and report.stored_hash == v1.def_hash and report.problems == []
    assert report.change.added == ("RETRY",)
    (row,) = report.live
    assert (row.state, row.status, row.count, row.verdict) == ("HOLD", "waiting", 1, "changed")

    with caplog.at_level(logging.WARNING, logger="eventbus.workflows"):
        await run_until(new, lambda: recorded(new, v2))
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "eventbus.workflows"]
    assert warning.startswith("shape: the table changed since the one in force")
    assert "states added: RETRY" in warning and "1 waiting instance(s) in HOLD: changed" in warning
    after = await new.workflows.changes(v2)
    assert not after.changed and after.live == () and after.lines() == []


async def test_instances_in_a_removed_state_are_a_problem_and_a_rename_makes_them_fine(
    make_bus: BusFactory,
) -> None:
    old: Bus = await make_bus()
    v1 = shaped()
    old.include(v1)
    await old.workflows.start(v1, D(key="d1"))
    await run_until(old, lambda: status_is(old, v1, "d1", "waiting"))

    removed: Bus = await make_bus()
    removed.include(shaped("removed"))
    report = await removed.workflows.changes("shape")
    assert report.change.removed == ("HOLD",) and report.change.added == ("KEEP",)
    assert [r.verdict for r in report.live] == ["gone"]
    (problem,) = report.problems
    assert problem.startswith("1 waiting instance(s) of shape are in HOLD, which the table no longer has")

    renamed: Bus = await make_bus()
    v3 = shaped("renamed", renamed={"HOLD": "KEEP"})
    renamed.include(v3)
    fine = await renamed.workflows.changes(v3)
    assert fine.change.renamed == (("HOLD", "KEEP"),) and fine.problems == []
    assert [(r.state, r.verdict, r.detail) for r in fine.live] == [
        ("HOLD", "renamed", "the next visit runs KEEP")
    ]

    async def moved_on() -> bool:  # its next tick runs KEEP, which yields: the pointer says KEEP
        return (await renamed.workflows.instance(v3, "d1")).state == "KEEP"

    await run_until(renamed, moved_on)
    inst = await renamed.workflows.instance(v3, "d1")
    assert inst.status == "waiting" and inst.checkpoint.ran[-1] == "KEEP"
    assert (await renamed.workflows.changes(v3)).live == ()


def waiting_in(state: str, **options: object) -> Machine[D]:
    """START -> ``state``, which waits an hour unless signalled ``nudge``."""
    m = Machine("wake", checkpoint=D, key=lambda c: c.key, **options)  # type: ignore[arg-type]

    async def body(c: D, ctx: StepContext) -> Yield | None:
        c.ran.append(ctx.state)
        if ctx.state == "START" or ctx.signal("nudge") is not None:
            return None
        return Yield()

    m.state(initial=True, on_success=state, on_failure="DONE", name="START")(body)
    m.state(on_success="DONE", on_failure="DONE", continue_run=False, poll=3600, max_visits=5,
            wake_on="nudge", name=state)(body)  # fmt: skip
    m.terminal("DONE")
    return m


async def test_a_signal_wakes_an_instance_still_in_the_old_name_of_a_renamed_state(
    make_bus: BusFactory,
) -> None:
    old: Bus = await make_bus()
    v1 = waiting_in("HOLD")
    old.include(v1)
    await old.workflows.start(v1, D(key="w1"))
    await run_until(old, lambda: status_is(old, v1, "w1", "waiting"))

    new: Bus = await make_bus()
    v2 = waiting_in("KEEP", renamed={"HOLD": "KEEP"})
    new.include(v2)
    assert await new.workflows.signal(v2, "w1", "nudge", {"n": 1})
    await finish(new, v2, ["w1"])
    inst = await new.workflows.instance(v2, "w1")
    assert (inst.state, inst.checkpoint.ran) == ("DONE", ["START", "HOLD", "KEEP"])
