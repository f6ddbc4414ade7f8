"""Per-state timeouts: a visit running past ``timeout_seconds`` takes its failure edge, on both backends."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from eventbus import Bus, DefinitionError
from eventbus.workflows import MAX_RETRIES, Machine, StepContext, diagram

from ._support import finish


class T(msgspec.Struct):
    key: str
    mode: str = "slow"
    touched: bool = False
    visits: list[str] = []


def timed(lease_seconds: float = 60.0) -> Machine[T]:
    """SLOW sleeps far past its 0.2 s timeout unless ``mode`` is fast; its failure edge is RECOVER."""
    m = Machine("timed", checkpoint=T, key=lambda c: c.key, lease_seconds=lease_seconds)

    @m.state(initial=True, on_success="DONE", on_failure="RECOVER", timeout_seconds=0.2)
    async def SLOW(c: T, ctx: StepContext) -> None:
        c.touched = True  # a timed-out visit keeps the checkpoint it read
        if c.mode != "fast":
            await anyio.sleep(3600)

    @m.state(on_success="DONE", on_failure="DONE")
    async def RECOVER(c: T, ctx: StepContext) -> None:
        c.visits.append(ctx.state)

    m.terminal("DONE")
    return m


async def test_a_visit_past_its_timeout_is_cancelled_and_takes_its_failure_edge(bus: Bus) -> None:
    m = timed()
    bus.include(m)
    await bus.workflows.start(m, T(key="slow"))
    await bus.workflows.start(m, T(key="fast", mode="fast"))
    await finish(bus, m, ["slow", "fast"])

    slow = await bus.workflows.instance(m, "slow")
    assert slow.state == "DONE" and slow.status == "completed"
    assert slow.checkpoint.touched is False and slow.checkpoint.visits == ["RECOVER"]
    first = (await bus.workflows.history(m, "slow"))[0]
    assert (first.state, first.outcome, first.next_state) == ("SLOW", "timeout", "RECOVER")
    assert first.error_code == "timeout" and first.error == "SLOW ran past its timeout of 0.2s"

    fast = await bus.workflows.instance(m, "fast")
    assert fast.checkpoint.touched is True and fast.checkpoint.visits == []
    assert [h.outcome for h in await bus.workflows.history(m, "fast")] == ["ok"]


async def test_a_state_that_times_out_on_every_visit_is_capped_by_max_visits(bus: Bus) -> None:
    m = Machine("timed-loop", checkpoint=T, key=lambda c: c.key)

    @m.state(initial=True, on_success="DONE", on_failure="HANG", max_visits=3, timeout_seconds=0.1)
    async def HANG(c: T, ctx: StepContext) -> None:
        await anyio.sleep(3600)

    m.terminal("DONE")
    bus.include(m)
    await bus.workflows.start(m, T(key="k"))
    await finish(bus, m, ["k"])

    inst = await bus.workflows.instance(m, "k")
    assert (inst.state, inst.status, inst.visits) == (MAX_RETRIES, "failed", {"HANG": 3})
    outcomes = [(h.state, h.visit, h.outcome) for h in await bus.workflows.history(m, "k")]
    assert outcomes == [("HANG", 1, "timeout"), ("HANG", 2, "timeout"), ("HANG", 3, "timeout"),
                        ("HANG", 3, "cap")]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "positive, finite"),
        (-1.5, "positive, finite"),
        (float("nan"), "positive, finite"),
        (float("inf"), "positive, finite"),
        (True, "not bool"),
        ("5", "not str"),
        (31, "over half the machine's lease_seconds=60"),
    ],
)
def test_a_bad_timeout_is_refused_at_definition(value: object, message: str) -> None:
    m = Machine("bad-timeout", checkpoint=T, key=lambda c: c.key)
    with pytest.raises(DefinitionError, match=message):
        m.state(initial=True, on_success="DONE", on_failure="DONE", timeout_seconds=value)  # type: ignore[arg-type]


def test_the_timeout_is_checked_again_against_the_lease_at_inclusion() -> None:
    m = timed(lease_seconds=60.0)
    m.lease_seconds = 0.3
    with pytest.raises(DefinitionError, match=r"raise Machine\(lease_seconds=\.\.\.\) to at least 0\.4"):
        m.check()
    assert "    SLOW : timeout 0.2s" in diagram(timed(), "mermaid")
