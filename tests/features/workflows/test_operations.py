"""Operator actions (repoint, pause, resume, cancel, resolve) and compensation, on both backends."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from eventbus import Bus, GuardMismatch, UnknownInstance
from eventbus.errors import UndeclaredState
from eventbus.types import WorkflowEffectRow
from eventbus.workflows import FAILED, UNCERTAIN, Goto, Machine, StepContext, Uncertain, Yield

from ._support import finish, run_until


class Task(msgspec.Struct):
    key: str
    note: str = ""
    polls: int = 0


gates: dict[str, anyio.Event] = {}
entered: dict[str, anyio.Event] = {}
undone: list[tuple[str, str, object]] = []

ops = Machine("ops", checkpoint=Task, key=lambda c: c.key, compensation_retry_seconds=0.05)


@ops.state(initial=True, on_success="SLOW", on_failure="DONE")
async def START(c: Task, ctx: StepContext) -> Uncertain | None:
    if c.key.startswith("unsure") and ctx.visit == 1:
        return Uncertain("provider timed out after submit")
    return None


@ops.state(on_success="DONE", on_failure="DONE", also=("LOOP", "EFFECTS", "OTHER"))
async def SLOW(c: Task, ctx: StepContext) -> object:
    if c.key.startswith("loop"):
        return Goto("LOOP")
    if c.key.startswith("fx"):
        return Goto("EFFECTS")
    if c.key in gates:
        entered[c.key].set()
        await gates[c.key].wait()
    c.note = "slow finished"
    return None


@ops.state(on_success="DONE", on_failure="DONE", continue_run=False, poll=0.05, max_visits=200)
async def LOOP(c: Task, ctx: StepContext) -> Yield | None:
    c.polls += 1
    return Yield() if c.polls < 200 else None


@ops.state(on_success="DONE", on_failure="FAILED")
async def EFFECTS(c: Task, ctx: StepContext) -> None:
    ctx.record_effect("card.charged", ref={"charge": f"ch-{c.key}"}, compensate=refund)
    ctx.record_effect("email.sent", ref={"to": c.key}, compensate="send_correction")
    raise RuntimeError("shipping refused the parcel")


@ops.state(on_success="DONE", on_failure="DONE")
async def OTHER(c: Task, ctx: StepContext) -> None:
    c.note = "other ran"


ops.terminal("DONE")


@ops.compensation
async def refund(c: Task, effect: WorkflowEffectRow, ctx: StepContext) -> None:
    if c.key.startswith("fx-stuck"):
        raise ConnectionError("payment provider unreachable")
    undone.append((c.key, effect.kind, effect.ref))


@ops.compensation
async def send_correction(c: Task, effect: WorkflowEffectRow, ctx: StepContext) -> None:
    undone.append((c.key, effect.kind, effect.ref))


@pytest.fixture
async def obus(bus: Bus) -> Bus:
    undone.clear()
    bus.include(ops)
    return bus


async def test_repoint_fences_a_visit_in_flight_and_is_audited(obus: Bus) -> None:
    gates["held"], entered["held"] = anyio.Event(), anyio.Event()
    await obus.workflows.start(ops, Task(key="held"))

    async def repoint_then_release() -> bool:
        if not entered["held"].is_set():
            return False
        with pytest.raises(GuardMismatch):
            await obus.workflows.repoint(ops, "held", to="OTHER", reason="stuck", expect="START")
        await obus.workflows.repoint(ops, "held", to="OTHER", reason="stuck in SLOW", expect="SLOW", by="ann")
        gates["held"].set()  # the fenced visit now tries to commit
        return True

    await run_until(obus, repoint_then_release)
    await finish(obus, ops, ["held"])
    inst = await obus.workflows.instance(ops, "held")
    assert (inst.state, inst.checkpoint.note) == ("DONE", "other ran")
    rows = [(r.state, r.outcome, r.next_state, r.actor) for r in await obus.workflows.history(ops, "held")]
    assert ("SLOW", "repoint", "OTHER", "operator:ann") in rows
    assert not any(state == "SLOW" and outcome == "ok" for state, outcome, _, _ in rows), (
        "the fenced visit wrote nothing"
    )
    assert (await obus.workflows.history(ops, "held"))[1].reason == "stuck in SLOW"
    with pytest.raises(UndeclaredState):
        await obus.workflows.repoint(ops, "held", to="NOWHERE", reason="typo")
    with pytest.raises(UnknownInstance):
        await obus.workflows.repoint(ops, "nobody", to="DONE", reason="x")


async def test_pause_stops_visits_until_resume_and_cancel_ends_the_run(obus: Bus) -> None:
    await obus.workflows.start(ops, Task(key="loop-1"))
    await run_until(obus, lambda: _polled(obus, "loop-1", 3))
    await obus.workflows.pause(ops, "loop-1", by="ann", reason="maintenance")
    paused = await obus.workflows.instance(ops, "loop-1")
    assert paused.status == "paused"
    with anyio.move_on_after(0.5):
        await run_until(obus, lambda: _never())
    assert (await obus.workflows.instance(ops, "loop-1")).checkpoint.polls == paused.checkpoint.polls
    with pytest.raises(GuardMismatch):
        await obus.workflows.pause(ops, "loop-1")
    await obus.workflows.resume(ops, "loop-1", by="ann")
    await run_until(obus, lambda: _polled(obus, "loop-1", paused.checkpoint.polls + 2))
    await obus.workflows.cancel(ops, "loop-1", by="ann", reason="not needed")
    inst = await obus.workflows.instance(ops, "loop-1")
    assert (inst.state, inst.status) == ("CANCELLED", "cancelled")
    outcomes = [r.outcome for r in await obus.workflows.history(ops, "loop-1") if r.actor == "operator:ann"]
    assert outcomes == ["pause", "resume", "cancel"]


async def _polled(bus: Bus, key: str, n: int) -> bool:
    return (await bus.workflows.instance(ops, key)).checkpoint.polls >= n


async def _never() -> bool:
    return False


async def test_compensations_run_in_reverse_on_a_failure_terminal(obus: Bus) -> None:
    await obus.workflows.start(ops, Task(key="fx-1"))
    await finish(obus, ops, ["fx-1"])
    inst = await obus.workflows.instance(ops, "fx-1")
    assert (inst.state, inst.status) == (FAILED, "failed")
    # The visit recorded two effects before it raised; they are undone last first, each
    # compensation given its effect with the ref as recorded.
    assert undone == [("fx-1", "email.sent", {"to": "fx-1"}), ("fx-1", "card.charged", {"charge": "ch-fx-1"})]
    rows = await obus.workflows.history(ops, "fx-1")
    assert [r.outcome for r in rows if r.state == "COMPENSATING"] == ["compensate"] * 2 + ["compensated"]


async def test_a_compensation_that_cannot_complete_leaves_the_instance_uncertain(obus: Bus) -> None:
    await obus.workflows.start(ops, Task(key="fx-stuck"))
    await finish(obus, ops, ["fx-stuck"])
    inst = await obus.workflows.instance(ops, "fx-stuck")
    assert (inst.state, inst.status) == (UNCERTAIN, "uncertain")
    failed = [r for r in await obus.workflows.history(ops, "fx-stuck") if r.outcome == "compensate-failed"]
    assert len(failed) == 3 and failed[0].error == "ConnectionError: payment provider unreachable"
    await obus.workflows.resolve(ops, "fx-stuck", outcome="failed", by="dora", reason="refunded by hand")
    assert (await obus.workflows.instance(ops, "fx-stuck")).state == FAILED


async def test_uncertain_stops_for_a_human_and_resolve_continues(obus: Bus) -> None:
    await obus.workflows.start(ops, Task(key="unsure-1"))
    await finish(obus, ops, ["unsure-1"])
    inst = await obus.workflows.instance(ops, "unsure-1")
    assert (inst.state, inst.status, inst.held_state) == (UNCERTAIN, "uncertain", "START")
    assert inst.last_error == "provider timed out after submit"
    with pytest.raises(GuardMismatch):
        await obus.workflows.resume(ops, "unsure-1")
    await obus.workflows.resolve(ops, "unsure-1", outcome="retry", by="carol", reason="checked the provider")
    await finish(obus, ops, ["unsure-1"])
    done = await obus.workflows.instance(ops, "unsure-1")
    assert (done.state, done.visits["START"]) == ("DONE", 2)
    resolved = [r for r in await obus.workflows.history(ops, "unsure-1") if r.outcome == "resolve"]
    assert [(r.actor, r.reason, r.next_state) for r in resolved] == [
        ("operator:carol", "retry: checked the provider", "START")
    ]
