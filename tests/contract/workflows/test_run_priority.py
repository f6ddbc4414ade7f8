"""A run's priority on every backend: stored on the instance, given to every step of the run."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec

from eventbus import Bus
from eventbus.backends.base import (
    ALL_CHILDREN,
    WorkflowApprovalRequest,
    WorkflowHistoryEntry,
    WorkflowStart,
    WorkflowTransition,
)
from eventbus.testing import drain
from eventbus.workflows import Machine, StepContext, Yield

from ...conftest import BusFactory, Target
from ...features.schedules._support import db_now, rewind, store_rows
from ...features.workflows._support import finish, run_until, status_is, step_deliveries

STEP_SECONDS = 60.0  # the default priority step: a delivery's priority_wait is its priority times this


async def _steps(bus: Bus, machine: str, key: str) -> list[tuple[str, int, float | None]]:
    """(reason, event priority, delivery priority_wait) of every step of one instance, in publish order.

    A step of a machine no subscription listens to has no delivery (its wait is None).
    """
    backend: Any = bus.backend
    params = (f"wf.step.{machine}", f"{machine}/{key}")
    if backend.kind == "postgres":
        sql = (
            'SELECT e.key, e.priority, d.priority_wait FROM "{s}".events e '
            'LEFT JOIN "{s}".deliveries d ON d.event_id = e.id '
            "WHERE e.event_type = $1 AND e.ordering_key = $2 ORDER BY e.id, d.id"
        ).replace("{s}", backend.schema_name)
        async with backend.db.conn() as conn:
            rows = [tuple(r) for r in await conn.fetch(sql, *params)]
    else:
        sql = (
            "SELECT e.key, e.priority, d.priority_wait FROM events e "
            "LEFT JOIN deliveries d ON d.event_id = e.id "
            "WHERE e.event_type = ? AND e.ordering_key = ? ORDER BY e.id, d.id"
        )
        rows = await backend.db.read(lambda c: [tuple(r) for r in c.execute(sql, params).fetchall()])
    return [(str(k).rsplit("/", 1)[1], int(p), None if w is None else float(w)) for k, p, w in rows]


def _move(key: str, expected: int, **options: Any) -> WorkflowTransition:
    fields: dict[str, Any] = {
        "machine": "store", "key": key, "expected_version": expected, "run_id": 1, "state": "B",
        "status": "running", "visits": {"A": 1}, "checkpoint": b"{}", "entered": True, "step": "next",
        "history": WorkflowHistoryEntry(state="A", visit=1, outcome="ok", actor="test"),
    }  # fmt: skip
    fields.update(options)
    return WorkflowTransition(**fields)


async def test_every_step_the_store_publishes_takes_the_runs_priority(bus: Bus) -> None:
    store = bus.backend.workflows
    inst, _ = await store.start("store", "k", "A", b"{}", priority=5)
    assert inst.priority == 5
    assert await store.commit_many([_move("k", 1)]) == [2], "a plain transition (one statement per batch)"
    assert await store.commit(_move("k", 2, status="waiting", step=None, wake_on=("go",))) == 3
    assert await store.signal("store", "k", "go", b"1", None, ["B"]) == "sent"
    request = WorkflowApprovalRequest("B", b'"in"', "h" * 64, 60.0)
    assert (
        await store.commit(
            _move("k", 3, status="waiting_approval", step=None, approval_request=request, next_run_in=0.0)
        )
        == 4
    )
    approval = (await store.approvals("store", "k"))[0]
    assert await store.decide(approval.id, "approved", "me", None) is not None
    assert await store.sweep("store", grace_seconds=-1.0) == 1, "a lost tick is published again"
    signal = (await store.signals("store", "k", False))[0]
    steps = await _steps(bus, "store", "k")
    reasons = ["start", "next", f"signal-{signal.id}", f"approval-{approval.id}"]
    assert [r for r, _, _ in steps][:4] == reasons and steps[4][0].startswith("sweep-") and len(steps) == 5
    assert {priority for _, priority, _ in steps} == {5}
    loaded = await store.load("store", "k")
    assert loaded is not None and loaded.priority == 5


async def test_children_keep_their_priority_and_wake_the_parent_at_its_own(bus: Bus) -> None:
    store = bus.backend.workflows
    await store.start("store", "p", "A", b"{}", priority=7)
    kids = (
        WorkflowStart("store", "kid-1", "A", b"{}", priority=2),
        WorkflowStart("store", "kid-2", "A", b"{}"),
    )
    fan = _move("p", 1, status="waiting", step=None, starts=kids, children_wait=ALL_CHILDREN)
    assert await store.commit(fan) == 2
    for key, expected in (("kid-1", 2), ("kid-2", 0)):
        child = await store.load("store", key)
        assert child is not None and child.priority == expected
        done = _move(key, 1, state="DONE", status="completed", step=None)
        assert await store.commit_many([done]) == [2], "a plain end: its parents' counts move in the batch"
        assert await _steps(bus, "store", key) == [("start", expected, None)]
    assert await _steps(bus, "store", "p") == [("start", 7, None), ("children", 7, None)]


async def test_a_new_run_of_the_key_takes_the_new_starts_priority(bus: Bus) -> None:
    store = bus.backend.workflows
    await store.start("store", "r", "A", b"{}", priority=6)
    assert await store.commit(_move("r", 1, state="DONE", status="completed", step=None)) == 2
    again, started = await store.start("store", "r", "A", b"{}", priority=1)
    assert started and (again.run_id, again.priority) == (2, 1)
    _, started = await store.start("store", "r", "A", b"{}", priority=9)
    assert not started, "a live run is left alone, its priority too"
    assert await store.commit(_move("r", 3)) == 4
    assert [(r, p) for r, p, _ in await _steps(bus, "store", "r")] == [
        ("start", 6),
        ("start", 1),
        ("next", 1),
    ]
    loaded = await store.load("store", "r")
    assert loaded is not None and loaded.priority == 1


# -- a machine run by a worker ---------------------------------------------------------


class Kid(msgspec.Struct):
    key: str


class Job(msgspec.Struct):
    key: str
    kids: int = 0
    kid_priority: int | None = None


prio_kid = Machine("prio_kid", checkpoint=Kid, key=lambda c: c.key)
prio_job = Machine("prio_job", checkpoint=Job, key=lambda c: c.key)


@prio_kid.state(initial=True, on_success="DONE", on_failure="DONE")
async def KID(c: Kid, ctx: StepContext) -> None:
    return None


prio_kid.terminal("DONE")


@prio_job.state(initial=True, on_success="HOLD", on_failure="FLAKY", max_visits=3)
async def FLAKY(c: Job, ctx: StepContext) -> None:
    if ctx.visit == 1:
        raise RuntimeError("the first visit fails; the state is visited again")


@prio_job.state(on_success="FAN", on_failure="FAILED", wake_on="go", poll=60.0, continue_run=False)
async def HOLD(c: Job, ctx: StepContext) -> Yield | None:
    return None if ctx.signal("go") is not None else Yield()


@prio_job.state(on_success="DONE", on_failure="FAILED", children=prio_kid, continue_run=False)
async def FAN(c: Job, ctx: StepContext) -> Yield | None:
    if ctx.children or not c.kids:
        return None
    for i in range(c.kids):
        ctx.start(prio_kid, Kid(key=f"{c.key}-{i}"), priority=c.kid_priority)
    return Yield(children="all")


prio_job.terminal("DONE")


async def _run(bus: Bus, jobs: list[tuple[Job, int | None]]) -> None:
    """Start each job (at its priority, or without one), wake each with a signal, run all to their end."""
    for job, priority in jobs:
        if priority is None:
            await bus.workflows.start(prio_job, job)
        else:
            await bus.workflows.start(prio_job, job, priority=priority)

    async def held() -> bool:
        for job, _ in jobs:
            if not await status_is(bus, prio_job, job.key, "waiting", "failed"):
                return False
        return True

    await run_until(bus, held, timeout=10)
    for job, _ in jobs:
        await bus.workflows.signal(prio_job, job.key, "go", True)
    await finish(bus, prio_job, [job.key for job, _ in jobs], timeout=10)


async def test_a_run_keeps_its_priority_through_a_revisit_a_signal_and_its_children(bus: Bus) -> None:
    bus.include(prio_job)
    bus.include(prio_kid)
    await _run(
        bus,
        [(Job(key="high", kids=2), 5), (Job("mixed", kids=1, kid_priority=1), 5), (Job("plain", 1), None)],
    )
    job = await bus.workflows.instance(prio_job, "high")
    assert (job.state, job.visits, job.priority) == ("DONE", {"FLAKY": 2, "HOLD": 2, "FAN": 2}, 5)
    steps = await _steps(bus, "prio_job", "high")
    assert {(p, w) for _, p, w in steps} == {(5, 5 * STEP_SECONDS)}, (
        f"every step delivery of the run at its priority: {steps}"
    )
    reasons = {r for r, _, _ in steps}
    assert {"start", "children"} <= reasons and any(r.startswith("signal-") for r in reasons), reasons
    for key, expected in (("high-0", 5), ("high-1", 5), ("mixed-0", 1), ("plain-0", 0)):
        assert (await bus.workflows.instance(prio_kid, key)).priority == expected, key
        assert {(p, w) for _, p, w in await _steps(bus, "prio_kid", key)} == {
            (expected, expected * STEP_SECONDS)
        }
    assert {p for _, p, _ in await _steps(bus, "prio_job", "mixed")} == {5}
    assert {(p, w) for _, p, w in await _steps(bus, "prio_job", "plain")} == {(0, 0.0)}, "the default stays 0"
    ids = [i for found in (await step_deliveries(bus, "prio_job", "high")).values() for i in found]
    assert len(ids) == len(steps) and {(await bus.delivery(i)).priority for i in ids} == {5}


# -- starts fired by schedules ------------------------------------------------------------


def _daily(when: datetime) -> Kid:
    return Kid(key=f"daily@{when.date().isoformat()}")


def _per_tenant(tenant: str, when: datetime) -> Kid:
    return Kid(key=f"{tenant}@{when.date().isoformat()}")


async def test_a_schedule_and_a_fan_out_start_runs_at_their_priority(bus: Bus, target: Target) -> None:
    bus.include(prio_kid)
    now = await db_now(target)
    day = timedelta(days=1)
    bus.schedule("prio-daily", start=prio_kid, checkpoint=_daily, every=day, anchor=now, priority=4)
    bus.schedule(
        "prio-tenants", start=prio_kid, checkpoint=_per_tenant, every=day, anchor=now,
        for_each=lambda: ["acme", "globex"], priority=2,
    )  # fmt: skip
    await bus.schedules.declare()
    for name in ("prio-daily", "prio-tenants"):
        await rewind(target, name, 86400)
    assert (await bus.schedules.tick()).fired == 2
    await drain(bus)
    runs = {i.key.split("@")[0]: i for i in await bus.workflows.instances(prio_kid)}
    assert {k: (i.status, i.priority) for k, i in runs.items()} == {
        "daily": ("completed", 4), "acme": ("completed", 2), "globex": ("completed", 2),
    }  # fmt: skip
    for key, run in runs.items():
        assert {p for _, p, _ in await _steps(bus, "prio_kid", run.key)} == {run.priority}, key


# -- the migration over runs stored before it --------------------------------------------


async def test_runs_stored_before_the_migration_are_priority_0(make_bus: BusFactory, target: Target) -> None:
    first = await make_bus()
    await first.backend.workflows.start("store", "old", "A", b"{}", priority=4)
    await first.aclose()
    for sqlite, postgres in (
        (
            "ALTER TABLE wf_instances DROP COLUMN priority",
            "ALTER TABLE {s}.wf_instances DROP COLUMN priority",
        ),
        (
            "DELETE FROM schema_migrations WHERE version = 17",
            "DELETE FROM {s}.schema_migrations WHERE version = 17",
        ),
    ):
        await store_rows(target, sqlite, postgres)  # the store as migration 0016 left it
    bus = target.bus()
    try:
        assert await bus.migrate() == ["0017_add_run_priorities.sql"]
        old = await bus.backend.workflows.load("store", "old")
        assert old is not None and (old.state, old.priority) == ("A", 0)
        assert await bus.backend.workflows.commit(_move("old", 1)) == 2
        new, _ = await bus.backend.workflows.start("store", "new", "A", b"{}", priority=3)
        assert new.priority == 3
        assert [(r, p) for r, p, _ in await _steps(bus, "store", "old")] == [("start", 4), ("next", 0)]
    finally:
        await bus.aclose()
