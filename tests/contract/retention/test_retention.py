"""Retention: what pruning deletes and what it must keep, on both backends."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import anyio
import asyncpg
import pytest

from eventbus import Context, DeadLetter, Event, NotFound, RetentionOverride, RetryPolicy, Worker
from eventbus.backends.ports import SubscriptionSpec
from eventbus.retention import Retention
from eventbus.types import PublishResult

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
