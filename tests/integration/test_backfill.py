"""A subscription registered while a publisher's transaction is open still gets its event."""

from __future__ import annotations

import anyio
import asyncpg

from eventbus import Context, Worker

from ..support.helpers import OrderPlaced, counts, drain


async def test_registration_during_an_open_publish_transaction_loses_nothing(pg_target) -> None:
    bus = pg_target.bus()
    await bus.migrate()
    conn = await asyncpg.connect(pg_target.dsn)
    try:

        @bus.subscribe(OrderPlaced, name="late")
        async def late(event: OrderPlaced, ctx: Context) -> None:
            pass

        tx = conn.transaction()
        await tx.start()
        await bus.publish(OrderPlaced(order_id="in-flight"), connection=conn)

        async def commit_soon() -> None:
            await anyio.sleep(0.5)  # registration is waiting for this transaction
            await tx.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit_soon)
            await drain(bus)  # registers "late" while the publish is uncommitted
        await drain(bus)
        assert await counts(bus) == {("late", "completed"): 1}
    finally:
        await conn.close()
        await bus.aclose()


async def _wait_until_registered(conn: asyncpg.Connection, schema: str, name: str) -> None:
    with anyio.fail_after(20):
        while not await conn.fetchval(f'SELECT count(*) FROM "{schema}".subscriptions WHERE name = $1', name):
            await anyio.sleep(0.05)


async def _wait_for_completed(bus, name: str, seconds: float) -> None:
    with anyio.move_on_after(seconds):
        while (await counts(bus))[(name, "completed")] < 1:
            await anyio.sleep(0.1)


async def test_publish_transaction_open_past_the_wait_still_reaches_a_new_subscription(pg_target) -> None:
    """The overlapping transaction outlives any inline wait: housekeeping finishes the backfill."""
    bus = pg_target.bus()
    await bus.migrate()
    publisher = await asyncpg.connect(pg_target.dsn)
    observer = await asyncpg.connect(pg_target.dsn)
    try:

        @bus.subscribe(OrderPlaced, name="late")
        async def late(event: OrderPlaced, ctx: Context) -> None:
            pass

        tx = publisher.transaction()
        await tx.start()
        await bus.publish(OrderPlaced(order_id="long-open"), connection=publisher)
        worker = Worker(bus, poll_interval_seconds=0.5, recovery_interval_seconds=0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await _wait_until_registered(observer, pg_target.schema, "late")
            await anyio.sleep(6.0)  # longer than any wait inside registration
            await tx.commit()
            await _wait_for_completed(bus, "late", 15)
            worker.stop()
        assert await counts(bus) == {("late", "completed"): 1}
        owed = await observer.fetchval(f'SELECT count(*) FROM "{pg_target.schema}".subscription_backfills')
        assert owed == 0
    finally:
        await publisher.close()
        await observer.close()
        await bus.aclose()


async def test_repeatable_read_snapshot_older_than_the_registration_still_reaches_it(pg_target) -> None:
    """A snapshot taken before the registration, with no xid yet, publishes after it."""
    bus = pg_target.bus()
    await bus.migrate()
    publisher = await asyncpg.connect(pg_target.dsn)
    observer = await asyncpg.connect(pg_target.dsn)
    schema = pg_target.schema
    try:

        @bus.subscribe(OrderPlaced, name="late")
        async def late(event: OrderPlaced, ctx: Context) -> None:
            pass

        tx = publisher.transaction(isolation="repeatable_read")
        await tx.start()
        await publisher.fetchval(f'SELECT count(*) FROM "{schema}".subscriptions')  # takes the snapshot
        worker = Worker(bus, poll_interval_seconds=0.5, recovery_interval_seconds=0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await _wait_until_registered(observer, schema, "late")
            await anyio.sleep(0.5)
            await bus.publish(OrderPlaced(order_id="old-snapshot"), connection=publisher)
            await tx.commit()
            await _wait_for_completed(bus, "late", 15)
            worker.stop()
        assert await counts(bus) == {("late", "completed"): 1}
    finally:
        await publisher.close()
        await observer.close()
        await bus.aclose()
