"""Reads from a streaming replica (``read_dsn``): what a replica answers, what it never does.

A throwaway primary and a streaming standby (``pg_basebackup -R``), never the
shared server. With replay paused on the standby, the bus's status, listings
and counts show the replica's (older) view and its lag, while claims, results
and an operator's replay still act on the primary's rows.
"""

from __future__ import annotations

import asyncio

import anyio
import asyncpg
import pytest

from eventbus import Bus, ConfigurationError, Context, RetryPolicy
from eventbus.types import DeliveryFilter

from ...features.web.conftest import client_of
from ...support.helpers import OrderPlaced, drain
from ...support.pgserver import PgServer


async def _events_on(dsn: str, schema: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f'SELECT count(*) FROM "{schema}".events'))
    finally:
        await conn.close()


async def _on_standby(standby: PgServer, sql: str) -> None:
    conn = await asyncpg.connect(standby.dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _replayed(primary: PgServer, standby: PgServer) -> None:
    """Until the standby has replayed everything the primary wrote so far (its schema included)."""
    conn = await asyncpg.connect(primary.dsn)
    try:
        lsn = await conn.fetchval("SELECT pg_current_wal_lsn()")
    finally:
        await conn.close()
    replica = await asyncpg.connect(standby.dsn)
    try:
        with anyio.fail_after(60):
            while not await replica.fetchval("SELECT pg_last_wal_replay_lsn() >= $1", lsn):
                await anyio.sleep(0.05)
    finally:
        await replica.close()


async def test_reads_go_to_the_replica_and_actions_to_the_primary() -> None:
    primary = await asyncio.to_thread(lambda: PgServer().start())
    standby: PgServer | None = None
    try:
        standby = await asyncio.to_thread(lambda: PgServer().start_standby_of(primary))
        schema = "replica_reads"
        bus = Bus(primary.dsn, schema=schema, read_dsn=standby.dsn)

        @bus.subscribe(OrderPlaced, name="h", retry=RetryPolicy(max_attempts=1))
        async def h(event: OrderPlaced, ctx: Context) -> None:
            if event.order_id.startswith("bad"):
                raise ValueError("refused")

        await bus.migrate()
        await _replayed(primary, standby)  # a replica behind the migration has no tables to read yet
        async with bus:
            await bus.register()
            for i in range(3):
                await bus.publish(OrderPlaced(order_id=f"o-{i}"))
            with anyio.fail_after(30):
                while (await bus.status()).events < 3:  # the replica catches up
                    await anyio.sleep(0.05)
            caught_up = await bus.status()
            assert caught_up.replica_lag_seconds is not None and caught_up.replica_lag_seconds >= 0

            await _on_standby(standby, "SELECT pg_wal_replay_pause()")
            await bus.publish(OrderPlaced(order_id="bad-1"))
            await bus.publish(OrderPlaced(order_id="o-4"))
            await drain(bus)  # claims and results on the primary, whatever the replica shows
            assert await _events_on(primary.dsn, schema) == 5
            with anyio.fail_after(30):
                while (lagging := await bus.status()).replica_lag_seconds == 0:
                    await anyio.sleep(0.1)
            lag = lagging.replica_lag_seconds
            assert lagging.events == 3 and lag is not None and lag > 0  # the replica's view, and its lag
            async with client_of(bus, None) as dashboard:  # the dashboard says where its figures come from
                page = (await dashboard.get("/")).text
            assert "read from a replica" in page and "behind the primary" in page
            assert await bus.count_deliveries(DeliveryFilter(status="dead")) == 0
            assert await bus.dead_letters() == []  # a listing: the replica's
            # An action walks the primary: the dead letter the replica has not seen is replayed.
            assert await bus.replay(DeliveryFilter(status="dead")) == 1

            await _on_standby(standby, "SELECT pg_wal_replay_resume()")
            with anyio.fail_after(30):
                while (await bus.status()).events < 5:
                    await anyio.sleep(0.05)
            assert [r.status for r in await bus.find_deliveries(DeliveryFilter(subscription="h"))].count(
                "pending"
            ) == 1  # the replayed one, now visible on the replica too
    finally:
        if standby is not None:
            await asyncio.to_thread(standby.destroy)
        await asyncio.to_thread(primary.destroy)


async def test_the_read_pool_never_writes(pg_target) -> None:
    bus = pg_target.bus(read_dsn=pg_target.dsn)  # even pointed at the primary itself
    try:
        await bus.migrate()
        async with bus.backend.reads.conn("a stray write") as conn:
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                await conn.execute(f'CREATE TABLE "{pg_target.schema}".stray ()')
        assert (await bus.status()).replica_lag_seconds is None  # a primary answered: no lag to show
    finally:
        await bus.aclose()


def test_a_postgresql_only_option_on_sqlite_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="read_dsn: not an option of the sqlite backend"):
        Bus(f"sqlite:///{tmp_path / 'bus.db'}", read_dsn="postgresql://replica/db")
