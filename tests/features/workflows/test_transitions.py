"""Transitions, caps, errors, yields and fencing of stale steps, on both backends."""

from __future__ import annotations

import inspect

import anyio
import msgspec
import pytest

from eventbus import Bus, CheckpointTooLarge
from eventbus.backends.base import workflow_step
from eventbus.workflows import MAX_RETRIES, Fail, Goto, Machine, StepContext, Yield

from ._support import TERMINAL, finish, run_until, status_is, step_deliveries


class Job(msgspec.Struct):
    key: str
    polls: int = 0
    ready_after: int = 3
    blob: str = ""
    depth: list[int] = []
    poll: float = 0.0


ran: list[tuple[str, str, int]] = []
"""(key, state, visit) of every state function run, across the tests of this module."""

flow = Machine("flow", checkpoint=Job, key=lambda c: c.key, max_checkpoint_bytes=2048)


@flow.state(initial=True, on_success="SUBMIT", on_failure="DONE")
async def INITIAL(c: Job, ctx: StepContext) -> None:
    ran.append((c.key, ctx.state, ctx.visit))


@flow.state(on_success="POLL", on_failure="JOB_FAILED", also=("BIG",), max_visits=3)
async def SUBMIT(c: Job, ctx: StepContext) -> Goto | None:
    ran.append((c.key, ctx.state, ctx.visit))
    if c.key.startswith("boom"):
        raise RuntimeError(f"submit exploded for {c.key}")
    if c.key.startswith("big"):
        return Goto("BIG")
    return None


@flow.state(on_success="DONE", on_failure="POLL", continue_run=False, poll=0.05, max_visits=6)
async def POLL(c: Job, ctx: StepContext) -> Yield | Fail | None:
    ran.append((c.key, ctx.state, ctx.visit))
    c.polls += 1
    c.depth.append(len(inspect.stack()))
    if c.key.startswith("flaky") and c.polls == 1:
        return Fail("status-api-down", "the status API did not answer")
    if c.polls < c.ready_after:
        return Yield(poll=c.poll) if c.poll else Yield()
    return None


@flow.state(on_success="SUBMIT", on_failure="DONE", max_visits=3)
async def JOB_FAILED(c: Job, ctx: StepContext) -> None:
    ran.append((c.key, ctx.state, ctx.visit))


@flow.state(on_success="DONE", on_failure="DONE")
async def BIG(c: Job, ctx: StepContext) -> None:
    c.blob = "x" * 4096


flow.terminal("DONE")


@pytest.fixture
async def fbus(bus: Bus) -> Bus:
    ran.clear()
    bus.include(flow)
    return bus


def visits_of(key: str) -> list[tuple[str, int]]:
    return [(state, visit) for k, state, visit in ran if k == key]


async def test_success_path_yields_then_finishes(fbus: Bus) -> None:
    run = await fbus.workflows.start(flow, Job(key="ok-1"))
    assert run.started and run.run_id == 1
    await finish(fbus, flow, ["ok-1"])
    inst = await fbus.workflows.instance(flow, "ok-1")
    assert (inst.state, inst.status, inst.checkpoint.polls) == ("DONE", "completed", 3)
    assert inst.visits == {"INITIAL": 1, "SUBMIT": 1, "POLL": 3}
    rows = await fbus.workflows.history(flow, "ok-1")
    assert [(r.state, r.visit, r.outcome, r.next_state, r.yielded) for r in rows] == [
        ("INITIAL", 1, "ok", "SUBMIT", False),
        ("SUBMIT", 1, "ok", "POLL", False),
        ("POLL", 1, "yield", "POLL", True),
        ("POLL", 2, "yield", "POLL", True),
        ("POLL", 3, "ok", "DONE", False),
    ]
    assert [r.version for r in rows] == [2, 3, 4, 5, 6]
    assert len(set(inst.checkpoint.depth)) == 1, "every visit runs at the same stack depth"


async def test_start_is_idempotent_while_live_and_starts_a_new_run_after(fbus: Bus) -> None:
    first = await fbus.workflows.start(flow, Job(key="again"))
    second = await fbus.workflows.start(flow, Job(key="again", ready_after=1))
    assert first.started and not second.started and second.run_id == 1
    await finish(fbus, flow, ["again"])
    third = await fbus.workflows.start(flow, Job(key="again", ready_after=1))
    assert third.started and third.run_id == 2
    await finish(fbus, flow, ["again"])
    inst = await fbus.workflows.instance(flow, "again")
    assert (inst.run_id, inst.visits["POLL"], inst.checkpoint.polls) == (2, 1, 1)


async def test_exception_takes_the_failure_edge_and_caps_end_in_max_retries(fbus: Bus) -> None:
    await fbus.workflows.start(flow, Job(key="boom-1"))
    await finish(fbus, flow, ["boom-1"])
    inst = await fbus.workflows.instance(flow, "boom-1")
    assert (inst.state, inst.status) == (MAX_RETRIES, "failed")
    assert inst.last_error == "max retries reached: SUBMIT visited 3 times"
    assert visits_of("boom-1") == [
        ("INITIAL", 1), ("SUBMIT", 1), ("JOB_FAILED", 1), ("SUBMIT", 2), ("JOB_FAILED", 2), ("SUBMIT", 3),
        ("JOB_FAILED", 3),
    ]  # fmt: skip
    rows = await fbus.workflows.history(flow, "boom-1")
    errors = [r for r in rows if r.outcome == "error"]
    assert len(errors) == 3
    assert all(r.error == "RuntimeError: submit exploded for boom-1" for r in errors)
    assert all(r.error_code == "RuntimeError" and r.next_state == "JOB_FAILED" for r in errors)
    last = rows[-1]
    assert (last.state, last.outcome, last.next_state) == ("SUBMIT", "cap", MAX_RETRIES)
    assert last.reason == "max retries reached: SUBMIT visited 3 times"


async def test_a_poll_that_never_finishes_ends_after_exactly_its_cap(fbus: Bus) -> None:
    await fbus.workflows.start(flow, Job(key="never", ready_after=10**6))
    await finish(fbus, flow, ["never"])
    inst = await fbus.workflows.instance(flow, "never")
    assert (inst.state, inst.last_error) == (MAX_RETRIES, "max retries reached: POLL visited 6 times")
    assert [v for s, v in visits_of("never") if s == "POLL"] == [1, 2, 3, 4, 5, 6]
    assert inst.checkpoint.polls == 6


async def test_fail_takes_the_failure_edge_with_its_code(fbus: Bus) -> None:
    await fbus.workflows.start(flow, Job(key="flaky-1"))
    await finish(fbus, flow, ["flaky-1"])
    rows = await fbus.workflows.history(flow, "flaky-1")
    failed = [r for r in rows if r.outcome == "fail"]
    assert [(r.state, r.error_code, r.error, r.next_state) for r in failed] == [
        ("POLL", "status-api-down", "the status API did not answer", "POLL")
    ]
    assert (await fbus.workflows.instance(flow, "flaky-1")).status == "completed"


async def test_a_run_that_completes_keeps_no_last_error(fbus: Bus) -> None:
    await fbus.workflows.start(flow, Job(key="flaky-2"))
    await run_until(fbus, lambda: _failed_once(fbus, "flaky-2"))
    failing = await fbus.workflows.instance(flow, "flaky-2")
    assert (failing.last_error_code, failing.last_error) == (
        "status-api-down",
        "the status API did not answer",
    )
    await finish(fbus, flow, ["flaky-2"])
    inst = await fbus.workflows.instance(flow, "flaky-2")
    assert (inst.status, inst.last_error_code, inst.last_error) == ("completed", None, None)
    assert [r.error_code for r in await fbus.workflows.history(flow, "flaky-2") if r.error_code] == [
        "status-api-down"
    ], "the history keeps the error"


async def _failed_once(bus: Bus, key: str) -> bool:
    return any(r.outcome == "fail" for r in await bus.workflows.history(flow, key))


def test_the_step_context_shows_its_attributes() -> None:
    for name in ("machine", "key", "run_id", "version", "state", "visit", "attempt", "approval", "op_key"):
        assert name in dir(StepContext) and name in StepContext.__annotations__, name


async def test_an_oversized_checkpoint_takes_the_failure_edge_and_keeps_the_old_one(fbus: Bus) -> None:
    await fbus.workflows.start(flow, Job(key="big-1"))
    await finish(fbus, flow, ["big-1"])
    rows = await fbus.workflows.history(flow, "big-1")
    assert rows[-1].state == "BIG" and rows[-1].error_code == "checkpoint-too-large"
    inst = await fbus.workflows.instance(flow, "big-1")
    assert inst.state == "DONE" and inst.checkpoint.blob == ""
    with pytest.raises(CheckpointTooLarge):
        await fbus.workflows.start(flow, Job(key="big-2", blob="y" * 4096))


async def test_a_yielded_instance_holds_no_delivery_while_it_waits(fbus: Bus) -> None:
    await fbus.workflows.start(flow, Job(key="wait-1", ready_after=2, poll=30.0))
    worker = await run_until(fbus, lambda: status_is(fbus, flow, "wait-1", "waiting"))
    assert worker.processed >= 3
    steps = await step_deliveries(fbus, "flow", "wait-1")
    assert "processing" not in steps
    assert len(steps["pending"]) == 1 and len(steps["completed"]) == 3
    inst = await fbus.workflows.instance(flow, "wait-1")
    assert inst.next_run_at is not None and (inst.next_run_at - inst.updated_at).total_seconds() > 25


async def test_stale_and_duplicate_steps_are_no_ops(fbus: Bus) -> None:
    # The step subscription is FIFO per instance: the copies queue behind the
    # pending tick (due after its 1 s poll); whichever runs first makes the visit.
    await fbus.workflows.start(flow, Job(key="dup-1", ready_after=2, poll=1.0))
    await run_until(fbus, lambda: status_is(fbus, flow, "dup-1", "waiting"))
    waiting = await fbus.workflows.instance(flow, "dup-1")
    before = len(visits_of("dup-1"))
    # Three copies of the current step and one of an old version.
    steps = [workflow_step("flow", "dup-1", waiting.version, f"copy{i}") for i in range(3)]
    steps.append(workflow_step("flow", "dup-1", waiting.version - 2, "old"))
    await fbus.backend.deliveries.publish(steps)
    await finish(fbus, flow, ["dup-1"])
    assert visits_of("dup-1")[before:] == [("POLL", 2)]
    rows = await fbus.workflows.history(flow, "dup-1")
    assert [r.version for r in rows] == list(range(2, 2 + len(rows)))
    assert (await fbus.workflows.instance(flow, "dup-1")).version == waiting.version + 1


async def test_a_lost_tick_is_found_again_by_the_sweep(fbus: Bus) -> None:
    await fbus.workflows.start(flow, Job(key="lost-1", ready_after=2, poll=0.3))
    await run_until(fbus, lambda: status_is(fbus, flow, "lost-1", "waiting"))
    pending = (await step_deliveries(fbus, "flow", "lost-1"))["pending"]
    assert await fbus.cancel(pending) == 1  # the tick is gone
    assert await fbus.workflows.sweep(flow, grace_seconds=60) == 0  # not overdue yet
    with anyio.fail_after(5):
        while not await fbus.workflows.sweep(flow, grace_seconds=0):
            await anyio.sleep(0.05)
    await finish(fbus, flow, ["lost-1"])
    assert (await fbus.workflows.instance(flow, "lost-1")).status == "completed"


swept = Machine("swept", checkpoint=Job, key=lambda c: c.key, sweep_interval=0.2, sweep_grace=0.0)


@swept.state(initial=True, on_success="DONE", on_failure="DONE", continue_run=False, poll=0.3, max_visits=100)
async def TICK(c: Job, ctx: StepContext) -> Yield | None:
    c.polls += 1
    return Yield() if c.polls < c.ready_after else None


swept.terminal("DONE")


async def test_the_sweep_runs_by_itself_on_the_step_path(bus: Bus) -> None:
    bus.include(swept)
    await bus.workflows.start(swept, Job(key="lost", ready_after=2))
    await run_until(bus, lambda: status_is(bus, swept, "lost", "waiting"))
    pending = (await step_deliveries(bus, "swept", "lost"))["pending"]
    assert await bus.cancel(pending) == 1
    await bus.workflows.start(swept, Job(key="busy", ready_after=20))  # keeps steps flowing
    await finish(bus, swept, ["lost"], timeout=10)
    assert (await bus.workflows.instance(swept, "lost")).checkpoint.polls == 2


aged = Machine("aged", checkpoint=Job, key=lambda c: c.key)


# A busy machine may take a while to claim the first step: max_age leaves it time to; at most
# max_age / poll + 1 visits.
@aged.state(initial=True, on_success="DONE", on_failure="DONE", continue_run=False, poll=0.4, max_age=2.0)
async def FOREVER(c: Job, ctx: StepContext) -> Yield:
    c.polls += 1
    return Yield()


aged.terminal("DONE")


async def test_max_age_ends_a_state_that_never_finishes(bus: Bus) -> None:
    bus.include(aged)
    started = False

    async def done() -> bool:  # start once the worker serves: its start-up is no part of max_age
        nonlocal started
        if not started and (await bus.status()).workers:
            await bus.workflows.start(aged, Job(key="old"))
            started = True
        return started and (await bus.workflows.instance(aged, "old")).status in TERMINAL

    await run_until(bus, done)
    inst = await bus.workflows.instance(aged, "old")
    assert (inst.state, inst.status) == (MAX_RETRIES, "failed")
    assert inst.last_error is not None and inst.last_error.startswith("max age reached: FOREVER for ")
    assert 1 <= inst.checkpoint.polls <= 6, "visits are at least a poll apart and stop past max_age"
