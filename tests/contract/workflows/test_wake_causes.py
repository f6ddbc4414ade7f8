"""What woke each visit, recorded in its history row on every backend; runs counted per state."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from eventbus import Bus
from eventbus.workflows import Approval, Machine, StepContext, Yield

from ...conftest import BusFactory, Target
from ...features.schedules._support import store_rows
from ...features.workflows._support import finish, run_until, status_is


class Job(msgspec.Struct):
    key: str
    polls: int = 0


woken = Machine("woken", checkpoint=Job, key=lambda c: c.key)


@woken.state(initial=True, on_success="POLL", on_failure="DONE")
async def BEGIN(c: Job, ctx: StepContext) -> None:
    pass


@woken.state(on_success="WAIT", on_failure="DONE", continue_run=False, poll=0.05)
async def POLL(c: Job, ctx: StepContext) -> Yield | None:
    c.polls += 1
    return Yield() if c.polls < 2 else None


@woken.state(on_success="CHARGE", on_failure="DONE", continue_run=False, poll=3600, wake_on="go")
async def WAIT(c: Job, ctx: StepContext) -> Yield | None:
    return None if ctx.signal("go") is not None else Yield()


@woken.state(on_success="DONE", on_failure="DONE",
             approval=Approval(timeout=timedelta(hours=1), on_deny="DONE", on_timeout="DONE"))  # fmt: skip
async def CHARGE(c: Job, ctx: StepContext) -> None:
    pass


woken.terminal("DONE")


async def _causes(bus: Bus, key: str) -> list[tuple[str, str, str | None]]:
    return [(h.state, h.outcome, h.woken_by) for h in await bus.workflows.history(woken, key)]


async def test_each_visit_records_what_woke_it(bus: Bus) -> None:
    bus.include(woken)
    await bus.workflows.start(woken, Job(key="k1"))
    await run_until(bus, lambda: status_is(bus, woken, "k1", "waiting"))
    await run_until(bus, _at(bus, "k1", "WAIT"))
    assert await bus.workflows.signal(woken, "k1", "go", {"n": 1})
    await run_until(bus, lambda: status_is(bus, woken, "k1", "waiting_approval"))
    (approval,) = await bus.workflows.approvals(woken, "k1")
    await bus.workflows.approve(approval.id, by="alice", reason="fine")
    await finish(bus, woken, ["k1"])
    assert await _causes(bus, "k1") == [
        ("BEGIN", "ok", "start"),
        ("POLL", "yield", "next"),
        ("POLL", "ok", "timer"),
        ("WAIT", "yield", "next"),
        ("WAIT", "ok", "signal:go"),
        ("CHARGE", "approval-requested", "next"),
        ("CHARGE", "ok", "approved:alice"),
    ]


def _at(bus: Bus, key: str, state: str) -> Any:
    async def done() -> bool:
        inst = await bus.workflows.instance(woken, key)
        return inst.state == state and inst.status == "waiting"

    return done


async def test_operator_moves_record_no_cause_and_wake_the_next_visit(bus: Bus) -> None:
    bus.include(woken)
    await bus.workflows.start(woken, Job(key="k2"))
    await run_until(bus, _at(bus, "k2", "WAIT"))
    await bus.workflows.repoint(woken, "k2", to="CHARGE", reason="skip the wait", by="bob")
    await run_until(bus, lambda: status_is(bus, woken, "k2", "waiting_approval"), timeout=5)
    (approval,) = await bus.workflows.approvals(woken, "k2")
    await bus.workflows.deny(approval.id, by="carol")
    await finish(bus, woken, ["k2"])
    causes = await _causes(bus, "k2")
    assert ("WAIT", "repoint", None) in causes, "an operator's action is not woken"
    assert ("CHARGE", "approval-requested", "repoint") in causes
    assert causes[-1] == ("CHARGE", "denied", "denied:carol")


async def test_runs_are_counted_per_state(bus: Bus) -> None:
    bus.include(woken)
    for key in ("a", "b", "c"):
        await bus.workflows.start(woken, Job(key=key))

    async def all_waiting() -> bool:
        counts = await bus.workflows.counts(woken)
        return counts.get(("WAIT", "waiting"), 0) == 3

    await run_until(bus, all_waiting)
    await bus.workflows.signal(woken, "a", "go", {})
    await run_until(bus, lambda: status_is(bus, woken, "a", "waiting_approval"))
    counts = await bus.workflows.counts(woken)
    assert counts == {("WAIT", "waiting"): 2, ("CHARGE", "waiting_approval"): 1}


async def test_history_written_before_the_migration_reads_as_unknown(
    make_bus: BusFactory, target: Target
) -> None:
    first = await make_bus()
    await first.backend.workflows.start("store", "old", "A", b"{}")
    from .test_run_priority import _move

    assert await first.backend.workflows.commit(_move("old", 1)) == 2
    await first.aclose()
    for sqlite, postgres in (
        ("ALTER TABLE wf_history DROP COLUMN woken_by", "ALTER TABLE {s}.wf_history DROP COLUMN woken_by"),
        (
            "DELETE FROM schema_migrations WHERE version = 22",
            "DELETE FROM {s}.schema_migrations WHERE version = 22",
        ),
    ):
        await store_rows(target, sqlite, postgres)  # the history as it was stored before migration 0022
    bus = target.bus()
    try:
        assert await bus.migrate() == ["0022_add_history_wake_causes.sql"]
        store = bus.backend.workflows
        (old,) = await store.history("store", "old")
        assert (old.state, old.woken_by) == ("A", None)
        history = msgspec.structs.replace(_move("old", 2).history, woken_by="signal:go")  # type: ignore[type-var]
        assert await store.commit(_move("old", 2, history=history)) == 3
        assert await store.commit_many([_move("old", 3, history=history)]) == [4], "the batch statement too"
        assert [h.woken_by for h in await store.history("store", "old")] == [None, "signal:go", "signal:go"]
    finally:
        await bus.aclose()
