"""Retention: what pruning deletes and what it must keep, on both backends."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import anyio
import asyncpg
import msgspec
import pytest

from eventbus import (
    Context,
    DeadLetter,
    Event,
    NotFound,
    RetentionOverride,
    RetryPolicy,
    UnknownInstance,
    Worker,
)
from eventbus.backends.ports import SubscriptionSpec
from eventbus.retention import Retention
from eventbus.types import PublishResult
from eventbus.workflows import Approval, Machine, StepContext, Yield

from ...apps.schedule_events import Beat
from ...conftest import Target
from ...features.schedules._support import db_now, rewind, sqlite_path
from ...features.workflows._support import run_until, status_is
from ...support.helpers import OrderPlaced, counts, drain


class Later(Event, event_type="test.later"):
    n: int


KEEP_ALL = timedelta(days=1)


def _setup(bus) -> None:
    @bus.subscribe(OrderPlaced, name="ok", retry=RetryPolicy(max_attempts=1))
    async def ok(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id.startswith("bad"):
            raise ValueError("refused")

    # Only "ok" runs in these tests: "later" keeps its deliveries pending.
    @bus.subscribe(Later, name="later")
    async def later(event: Later, ctx: Context) -> None:
        raise AssertionError("never run")


async def _seed(bus) -> tuple[PublishResult, PublishResult]:
    await bus.register()
    keyed = await bus.publish(OrderPlaced(order_id="a1"), key="a1")
    plain = await bus.publish(OrderPlaced(order_id="b1"))
    await drain(bus, subscriptions=["ok"])
    return keyed, plain


async def test_completed_rows_go_dead_and_pending_stay_dedup_holds(make_bus) -> None:
    bus = await make_bus()
    _setup(bus)
    keyed, plain = await _seed(bus)
    dead = await bus.publish(OrderPlaced(order_id="bad-1"))
    pending = await bus.publish(Later(n=1))
    await drain(bus, subscriptions=["ok"])
    before = await counts(bus)
    assert before == {("ok", "completed"): 2, ("ok", "dead"): 1, ("later", "pending"): 1}

    # Within retention nothing goes.
    kept = await bus.prune(retention=Retention(completed_retention=KEEP_ALL))
    assert kept.total == 0 and await counts(bus) == before

    # A dry run counts and deletes nothing.
    dry = await bus.prune(dry_run=True, retention=Retention(completed_retention=timedelta(0)))
    assert (dry.completed_deliveries, dry.dead_deliveries, dry.events) == (2, 0, 1)
    assert await counts(bus) == before

    report = await bus.prune(
        retention=Retention(completed_retention=timedelta(0), dedup_window=timedelta(hours=1))
    )
    assert (report.completed_deliveries, report.dead_deliveries, report.events) == (2, 0, 1)
    assert await counts(bus) == {("ok", "dead"): 1, ("later", "pending"): 1}
    with pytest.raises(NotFound):
        await bus.trace(plain.event_id)  # no key: the event went with its deliveries
    assert (await bus.trace(keyed.event_id)).deliveries == []  # inside the dedup window: kept
    assert (await bus.trace(dead.event_id)).deliveries[0].status == "dead"
    assert (await bus.trace(pending.event_id)).deliveries[0].status == "pending"
    again = await bus.publish(OrderPlaced(order_id="a1"), key="a1")
    assert again.duplicate and again.event_id == keyed.event_id

    # Past the dedup window the keyed event goes, and its key is free again.
    report = await bus.prune(retention=Retention(completed_retention=timedelta(0), dedup_window=timedelta(0)))
    assert report.events == 1
    fresh = await bus.publish(OrderPlaced(order_id="a1"), key="a1")
    assert not fresh.duplicate and fresh.event_id != keyed.event_id

    # Dead rows go only past dead_retention, with their attempt history.
    dead_id = (await bus.trace(dead.event_id)).deliveries[0].id
    assert (await bus.delivery(dead_id)).history
    report = await bus.prune(retention=Retention(completed_retention=KEEP_ALL, dead_retention=timedelta(0)))
    assert report.dead_deliveries == 1 and report.attempts == 1
    with pytest.raises(NotFound):
        await bus.delivery(dead_id)
    assert (await bus.trace(pending.event_id)).deliveries[0].status == "pending"
    status = await bus.status()
    assert status.last_prune_at is not None


@pytest.mark.pooler
async def test_small_batches_walk_the_whole_log(make_bus) -> None:
    bus = await make_bus()
    _setup(bus)
    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=f"o{i}") for i in range(25)])
    await bus.publish(Later(n=1))  # a kept row in the middle of the walk
    await bus.publish_many([OrderPlaced(order_id=f"p{i}") for i in range(25)])
    await drain(bus, subscriptions=["ok"])
    report = await bus.prune(retention=Retention(completed_retention=timedelta(0), batch_size=7))
    assert report.completed_deliveries == 50 and report.events == 50 and report.batches >= 8
    assert await counts(bus) == {("later", "pending"): 1}


@pytest.mark.pooler
async def test_workers_prune_periodically(make_bus) -> None:
    retention = Retention(completed_retention=timedelta(0), interval=timedelta(seconds=0.2))
    bus = await make_bus(retention=retention)
    _setup(bus)
    await _seed(bus)
    worker = Worker(bus, subscriptions=["ok"], poll_interval_seconds=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(20):  # pruned, and the pass recorded (after its last batch)
            while (await counts(bus)).get(("ok", "completed")) or (await bus.status()).last_prune_at is None:
                await anyio.sleep(0.05)
        worker.stop()
    assert (await bus.status()).last_prune_at is not None


@pytest.mark.pooler
async def test_one_pruner_at_a_time(bus) -> None:
    async with bus.backend.retention.lock() as first:
        async with bus.backend.retention.lock() as second:
            assert first and not second
        report = await bus.prune()
        assert report.skipped and report.batches == 0
    async with bus.backend.retention.lock() as again:
        assert again


async def test_pg_pruner_lock_is_held_across_connections(pg_target) -> None:
    a, b = pg_target.bus(), pg_target.bus()
    await a.migrate()
    try:
        async with a.backend.retention.lock() as held:
            assert held
            assert (await b.prune()).skipped
        assert not (await b.prune()).skipped
    finally:
        await a.aclose()
        await b.aclose()


async def test_dead_rows_younger_than_completed_retention_are_reached(make_bus) -> None:
    bus = await make_bus()
    _setup(bus)
    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=f"bad-{i}") for i in range(5)])
    await drain(bus, subscriptions=["ok"])
    retention = Retention(completed_retention=KEEP_ALL, dead_retention=timedelta(0), batch_size=2)
    report = await bus.prune(retention=retention)
    assert report.dead_deliveries == 5 and report.events == 0
    assert await counts(bus) == {}


async def test_pg_pruner_lock_is_released_when_the_pass_is_cancelled(pg_target) -> None:
    a, b = pg_target.bus(), pg_target.bus()
    await a.migrate()
    try:
        with anyio.move_on_after(0.1):
            async with a.backend.retention.lock() as held:
                assert held
                await anyio.sleep(10)
        assert not (await b.prune()).skipped  # the pooled connection did not keep the lock
    finally:
        await a.aclose()
        await b.aclose()


async def test_per_subscription_overrides(make_bus) -> None:
    bus = await make_bus()
    _setup(bus)

    @bus.subscribe(OrderPlaced, name="audit")
    async def audit(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id.startswith("bad"):
            raise DeadLetter("audit refuses it too")

    await bus.register()
    kept = await bus.publish(OrderPlaced(order_id="a1"))
    died = await bus.publish(OrderPlaced(order_id="bad-1"))
    await drain(bus, subscriptions=["ok", "audit"])
    retention = Retention(
        completed_retention=timedelta(0),
        dead_retention=KEEP_ALL,
        per_subscription={
            "audit": RetentionOverride(completed_retention=KEEP_ALL, dead_retention=timedelta(0)),
            "ok": RetentionOverride(),  # nothing overridden: the bus's settings
        },
    )
    report = await bus.prune(retention=retention)
    assert (report.completed_deliveries, report.dead_deliveries, report.events) == (1, 1, 0)
    assert await counts(bus) == {("audit", "completed"): 1, ("ok", "dead"): 1}
    assert [d.subscription for d in (await bus.trace(kept.event_id)).deliveries] == ["audit"]
    assert [d.subscription for d in (await bus.trace(died.event_id)).deliveries] == ["ok"]


def test_negative_retention_is_refused() -> None:
    from eventbus import ConfigurationError

    with pytest.raises(ConfigurationError):
        Retention(completed_retention=timedelta(seconds=-1))
    with pytest.raises(ConfigurationError, match="audit"):
        Retention(per_subscription={"audit": RetentionOverride(dead_retention=timedelta(seconds=-1))})


async def test_pg_prune_during_a_backfill_keeps_the_events_it_backfills(pg_target) -> None:
    """A prune batch cannot see a registering transaction's backfilled deliveries: it keeps their events."""
    bus = pg_target.bus()
    await bus.migrate()
    other = await asyncpg.connect(pg_target.dsn)
    try:
        await bus.backend.deliveries.register([SubscriptionSpec("b", "test.order", 1, 30.0)])
        event_id = (await bus.publish(Later(n=1))).event_id  # no subscription yet: prunable
        # Hold b's row, so that the registration of a (then b) stops after a's backfill.
        await other.execute("BEGIN")
        table = f'"{pg_target.schema}".subscriptions'
        await other.execute(f"SELECT 1 FROM {table} WHERE name = $1 FOR UPDATE", "b")
        specs = [SubscriptionSpec("a", "test.later", 1, 30.0), SubscriptionSpec("b", "test.order", 1, 30.0)]
        registering = asyncio.ensure_future(bus.backend.deliveries.register(specs))
        with anyio.fail_after(20):
            while not await other.fetchval(  # a fresh statistics snapshot each time, inside the transaction
                "SELECT pg_stat_clear_snapshot(), count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'",
                column=1,
            ):
                await anyio.sleep(0.01)
        report = await bus.prune(retention=Retention(completed_retention=timedelta(0)))
        assert report.events == 0
        await other.execute("ROLLBACK")
        ids = await registering
        claimed = await bus.backend.deliveries.claim(ids["a"], 10, 30.0, str(uuid.uuid4()))
        assert [c.event_id for c in claimed] == [event_id]
    finally:
        await other.close()
        await bus.aclose()


async def _age_instances(target: Target, seconds: float) -> None:
    """Move every workflow instance's last change ``seconds`` into the past, as time passing would."""
    if target.kind == "postgres":
        conn = await asyncpg.connect(target.direct_dsn)
        try:
            table = f'"{target.schema}".wf_instances'
            await conn.execute(
                f"UPDATE {table} SET updated_at = updated_at - $1 * interval '1 second'", seconds
            )
        finally:
            await conn.close()
        return
    with sqlite3.connect(sqlite_path(target)) as db:
        db.execute("UPDATE wf_instances SET updated_at = updated_at - ?", (seconds,))


async def test_past_schedule_occurrences_go_and_waiting_ones_stay(make_bus, target: Target) -> None:
    now = await db_now(target)
    anchor = now - timedelta(minutes=30)
    bus = await make_bus()
    bus.schedule("hourly", Beat, every=timedelta(hours=1), anchor=anchor, missed="skip")
    await bus.schedules.declare()
    await rewind(target, "hourly", 5 * 3600)  # down for five periods: five skipped occurrences
    await bus.schedules.tick()
    requested = await bus.schedules.backfill(
        "hourly", anchor - timedelta(hours=4), anchor - timedelta(hours=3)
    )
    assert len(requested) == 2  # waiting to fire: kept however old

    def times() -> Callable[[], Awaitable[list[datetime]]]:
        async def read() -> list[datetime]:
            return sorted(o.scheduled_for for o in await bus.schedules.occurrences("hourly"))

        return read

    before = await times()()
    assert len(before) == 5
    two_hours = Retention(occurrence_retention=timedelta(hours=2), batch_size=1)
    dry = await bus.prune(dry_run=True, retention=two_hours)
    assert dry.occurrences == 1 and await times()() == before
    assert (await bus.prune(retention=two_hours)).occurrences == 1  # anchor - 2h; the younger stay
    assert await times()() == [t for t in before if t != anchor - timedelta(hours=2)]
    assert (await bus.prune(retention=Retention(occurrence_retention=None))).occurrences == 0
    report = await bus.prune(retention=Retention(occurrence_retention=timedelta(0), batch_size=2))
    assert report.occurrences == 2
    assert await times()() == requested
    await bus.schedules.tick()  # the requested ones still fire
    assert {o.status for o in await bus.schedules.occurrences("hourly")} == {"fired"}


class Job(msgspec.Struct):
    key: str


job = Machine("job", checkpoint=Job, key=lambda c: c.key)


@job.state(
    initial=True,
    on_success="GATE",
    on_failure="DONE",
    continue_run=False,
    poll=60.0,
    wake_on="go",
    max_visits=5,
)
async def WAIT(c: Job, ctx: StepContext) -> Yield | None:
    if ctx.signal("go") is None:
        return Yield()
    ctx.record_effect("mail.sent", ref={"to": c.key})
    return None


@job.state(
    on_success="DONE",
    on_failure="DONE",
    approval=Approval(timeout=timedelta(minutes=5), on_deny="DONE", on_timeout="DONE"),
)
async def GATE(c: Job, ctx: StepContext) -> None:
    return None


job.terminal("DONE")


async def test_finished_workflows_go_with_everything_they_left(make_bus, target: Target) -> None:
    bus = await make_bus()
    bus.include(job)
    for key in ("done", "live"):
        await bus.workflows.start(job, Job(key))
    await bus.workflows.signal(job, "done", "go", {"ok": True})
    await run_until(bus, lambda: status_is(bus, job, "done", "waiting_approval"))
    (approval,) = await bus.workflows.approvals(job, "done")
    await bus.workflows.approve(approval.id, by="alice")
    await run_until(bus, lambda: status_is(bus, job, "done", "completed"))
    live_history = await bus.workflows.history(job, "live")
    assert (await bus.workflows.instance(job, "live")).status == "waiting"
    history = await bus.workflows.history(job, "done")
    left = len(history) + 1 + 1 + 1  # its history, one signal, one effect, one approval

    hour = Retention(workflow_retention=timedelta(hours=1))
    assert (await bus.prune(retention=hour)).workflows == 0  # finished just now: kept
    await _age_instances(target, 2 * 3600)
    dry = await bus.prune(dry_run=True, retention=hour)
    assert (dry.workflows, dry.workflow_rows) == (1, left)
    assert await bus.workflows.history(job, "done") == history
    report = await bus.prune(retention=hour)
    assert (report.workflows, report.workflow_rows) == (1, left)

    with pytest.raises(UnknownInstance):
        await bus.workflows.instance(job, "done")
    assert await bus.workflows.history(job, "done") == []
    assert await bus.workflows.signals(job, "done") == []
    assert await bus.workflows.approvals(job, "done") == []
    # A live instance stays whole, however long ago it last moved.
    assert (await bus.workflows.instance(job, "live")).status == "waiting"
    assert await bus.workflows.history(job, "live") == live_history
    # The key starts again from nothing.
    again = await bus.workflows.start(job, Job("done"))
    assert again.started and again.run_id == 1


async def test_a_started_once_key_that_completed_outlives_workflow_retention(
    make_bus, target: Target
) -> None:
    bus = await make_bus()
    bus.include(job)
    await bus.workflows.start(job, Job("once"), once=True)
    await bus.workflows.signal(job, "once", "go", {"ok": True})
    await run_until(bus, lambda: status_is(bus, job, "once", "waiting_approval"))
    (approval,) = await bus.workflows.approvals(job, "once")
    await bus.workflows.approve(approval.id, by="alice")
    await run_until(bus, lambda: status_is(bus, job, "once", "completed"))
    await _age_instances(target, 2 * 3600)
    assert (await bus.prune(retention=Retention(workflow_retention=timedelta(hours=1)))).workflows == 0
    again = await bus.workflows.start(job, Job("once"), once=True)
    assert not again.started and again.done  # still known as done: never processed twice


async def test_a_cancelled_pass_stops_between_batches(bus) -> None:
    """A worker's stop cancels its retention pass: the batch in flight finishes, the walk does not go on."""

    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        return None

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(40)])
    await drain(bus)
    retention = Retention(completed_retention=timedelta(0), dedup_window=timedelta(0), batch_size=2)
    with anyio.CancelScope() as scope:
        await bus.prune(retention=retention, progress=lambda report: scope.cancel())
    assert scope.cancelled_caught
    assert (await counts(bus))[("h", "completed")] >= 36  # one batch of 2 events went, not the walk
