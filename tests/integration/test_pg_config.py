"""PostgreSQL settings: every accepted schema name works, timeouts say what timed out."""

from __future__ import annotations

import uuid

import anyio
import asyncpg
import pytest

from eventbus import BackendUnavailable, Bus, ConfigurationError, Context, Worker
from eventbus.backends.postgres import PostgresBackend

from ..support.helpers import OrderPlaced, counts


async def test_longest_schema_name_publishes_and_wakes_a_worker(pg_dsn: str) -> None:
    schema = ("t_" + uuid.uuid4().hex * 2)[:63]
    bus = Bus(pg_dsn, schema=schema)
    publisher = Bus(pg_dsn, schema=schema)
    try:
        await bus.migrate()
        handled = anyio.Event()

        @bus.subscribe(OrderPlaced, name="h")
        async def h(event: OrderPlaced, ctx: Context) -> None:
            handled.set()

        worker = Worker(bus, poll_interval_seconds=60.0)  # only a NOTIFY can wake it in time
        backend = bus.backend
        assert isinstance(backend, PostgresBackend)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(10):
                while not (await bus.list_subscriptions()) or not backend.wakeups.healthy:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.2)  # the worker is idle, waiting
            await publisher.publish(OrderPlaced(order_id="long-schema"))
            with anyio.fail_after(10):
                await handled.wait()
            worker.stop()
        assert await counts(bus) == {("h", "completed"): 1}
    finally:
        await bus.aclose()
        await publisher.aclose()
        conn = await asyncpg.connect(pg_dsn)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


async def test_query_timeout_names_the_operation(pg_target) -> None:
    bus = pg_target.bus(command_timeout=0.5)
    await bus.migrate()
    locker = await asyncpg.connect(pg_target.dsn)
    try:
        async with locker.transaction():
            await locker.execute(f'LOCK TABLE "{pg_target.schema}".deliveries IN ACCESS EXCLUSIVE MODE')
            with pytest.raises(BackendUnavailable, match=r"timed out: status got no answer within 0.5s"):
                await bus.status()
    finally:
        await locker.close()
        await bus.aclose()


async def test_a_value_the_driver_cannot_encode_is_refused_not_unavailable(pg_target) -> None:
    from eventbus import BackendError
    from eventbus.backends.base import OutgoingEvent

    bus = pg_target.bus()
    await bus.migrate()
    try:
        bad = OutgoingEvent(event_type="test.order_placed", payload=b"{}", key=42)  # type: ignore[arg-type]
        with pytest.raises(BackendError) as caught:
            await bus.backend.deliveries.publish([bad])
        assert not isinstance(caught.value, BackendUnavailable)
    finally:
        await bus.aclose()


async def test_the_server_ends_a_session_left_idle_in_a_transaction(pg_target) -> None:
    """A client that stops answering inside a transaction (a cut-off host) holds its row locks
    only until ``dead_client_seconds``: the server then ends the session."""
    bus = pg_target.bus(dead_client_seconds=1)
    try:
        await bus.migrate()
        async with bus.backend.db.conn() as conn:
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1s"
            assert await conn.fetchval("SHOW tcp_keepalives_count") == "2"
            tx = conn.transaction()
            await tx.start()
            await conn.fetchval("SELECT 1")
            await anyio.sleep(1.5)  # the client goes quiet inside the transaction
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
                await conn.fetchval("SELECT 1")
    finally:
        await bus.aclose()
    with pytest.raises(ConfigurationError, match="dead_client_seconds must be at least 1"):
        pg_target.bus(dead_client_seconds=0.5)
