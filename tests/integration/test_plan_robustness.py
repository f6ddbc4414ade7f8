"""The claim path stays an index read as tables grow and while dead entries pile up.

These tests run on PostgreSQL, whose plans and MVCC they are about. Plans are
observed through the server's own counters (``pg_stat_user_tables``), never by
timing.
"""

from __future__ import annotations

import json
import uuid

import anyio
import asyncpg
import pytest

from eventbus import Bus, Context
from eventbus.backends.postgres import PostgresBackend
from eventbus.backends.postgres import delivery as pg_deliveries

from ..support.helpers import OrderPlaced
from ..support.plans import rows_read

SEED = """
WITH ev AS (
    INSERT INTO {s}.events (event_type, payload)
    SELECT 'order.placed', convert_to('{{"order_id":"' || g || '"}}', 'UTF8')
    FROM generate_series(1, $1::int) g
    RETURNING id
)
INSERT INTO {s}.deliveries (event_id, subscription_id, run_at, status)
SELECT id, $2::int, now() - interval '1 hour', 'completed' FROM ev
"""


async def _seq_scans(dsn: str, schema: str) -> int:
    """Sequential scans of deliveries so far, as the statistics collector has them."""
    conn = await asyncpg.connect(dsn)
    try:
        value = await conn.fetchval(
            "SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'deliveries'",
            schema,
        )
        return int(value)
    finally:
        await conn.close()


async def _flushed_seq_scans(bus: Bus, dsn: str, schema: str) -> int:
    """Let the bus's one pooled connection report its counters, then read them.

    A backend reports at the end of a transaction once a second has passed
    since its last report; the heartbeat is a transaction that reads no
    deliveries.
    """
    await anyio.sleep(1.2)
    await bus.backend.deliveries.worker_beat(str(uuid.uuid4()))
    await anyio.sleep(0.2)
    return await _seq_scans(dsn, schema)


async def _publish_and_claim(bus: Bus, sub_id: int, times: int) -> None:
    for i in range(times):
        await bus.publish(OrderPlaced(order_id=f"o{i}"))
        claimed = await bus.backend.deliveries.claim(sub_id, 10, 30.0, str(uuid.uuid4()))
        assert len(claimed) == 1


async def test_claim_is_planned_again_after_the_table_grows(pg_target) -> None:
    """A generic plan made while deliveries was nearly empty (a sequential scan for
    the claim's update) must not outlive the table's growth when no ANALYZE comes
    (autovacuum off or behind): pooled statements are prepared again."""
    bus = pg_target.bus(min_pool_size=1, max_pool_size=1, statement_lifetime_seconds=2)
    bus.subscribe(OrderPlaced, name="h")(_noop)
    try:
        await bus.migrate()
        sub_id = (await bus.register())["h"]
        await _publish_and_claim(bus, sub_id, 8)  # past the five custom plans: generic from here
        conn = await asyncpg.connect(pg_target.dsn)
        try:
            await conn.execute(SEED.format(s=f'"{pg_target.schema}"'), 100_000, sub_id)
        finally:
            await conn.close()
        await anyio.sleep(2.5)  # past the statement lifetime
        before = await _flushed_seq_scans(bus, pg_target.dsn, pg_target.schema)
        await _publish_and_claim(bus, sub_id, 5)
        after = await _flushed_seq_scans(bus, pg_target.dsn, pg_target.schema)
    finally:
        await bus.aclose()
    assert after - before == 0, f"{after - before} sequential scans of deliveries in 5 claims"


async def test_lease_expired_before_the_sweep_window_is_still_recovered(
    pg_target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep walks only from where the previous one ended; a lease that expired
    earlier (its row was locked by a holder that then rolled back) is found by the
    sweep from the start that follows."""
    monkeypatch.setattr(pg_deliveries, "_FULL_SWEEP_EVERY", 1.0)
    bus = pg_target.bus()
    bus.subscribe(OrderPlaced, name="h")(_noop)
    try:
        await bus.migrate()
        sub_id = (await bus.register())["h"]
        await bus.publish(OrderPlaced(order_id="stale"))
        (claimed,) = await bus.backend.deliveries.claim(sub_id, 10, 30.0, str(uuid.uuid4()))
        assert await bus.backend.deliveries.recover_expired() == 0  # from the start; sets the window
        conn = await asyncpg.connect(pg_target.dsn)
        try:  # as if its lease ran out an hour ago, unseen by the sweeps since
            await conn.execute(
                f"UPDATE \"{pg_target.schema}\".deliveries SET lease_until = now() - interval '1 hour' "
                "WHERE id = $1",
                claimed.id,
            )
        finally:
            await conn.close()
        assert await bus.backend.deliveries.recover_expired() == 0  # the window starts after it
        await anyio.sleep(1.1)
        assert await bus.backend.deliveries.recover_expired() == 1  # the sweep from the start
        assert (await bus.delivery(claimed.id)).status == "pending"
    finally:
        await bus.aclose()


async def test_an_expired_lease_skipped_while_locked_is_taken_by_the_next_sweep(pg_target) -> None:
    """A row whose lease expired while another session held it (a cut-off worker's open
    transaction) keeps the sweep's window from moving past it: once the lock goes, the next
    sweep takes it, not the sweep from the start a minute later."""
    bus = pg_target.bus()
    bus.subscribe(OrderPlaced, name="h")(_noop)
    try:
        await bus.migrate()
        sub_id = (await bus.register())["h"]
        await bus.publish(OrderPlaced(order_id="held"))
        (claimed,) = await bus.backend.deliveries.claim(sub_id, 10, 0.2, str(uuid.uuid4()))
        assert await bus.backend.deliveries.recover_expired() == 0  # from the start: nothing expired yet
        holder = await asyncpg.connect(pg_target.dsn)
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute(
                f'SELECT 1 FROM "{pg_target.schema}".deliveries WHERE id = $1 FOR UPDATE', claimed.id
            )
            for _ in range(6):  # 3 s of windowed sweeps while its lease has expired: skipped
                await anyio.sleep(0.5)
                assert await bus.backend.deliveries.recover_expired() == 0
            await tx.rollback()
        finally:
            await holder.close()
        assert await bus.backend.deliveries.recover_expired() == 1
        assert (await bus.delivery(claimed.id)).status == "pending"
    finally:
        await bus.aclose()


async def _noop(event: OrderPlaced, ctx: Context) -> None:
    return None


@pytest.mark.parametrize("append_only", [False, True], ids=["default", "append-only"])
async def test_a_claim_reads_each_claimed_event_by_key_whatever_the_statistics(
    pg_target, append_only: bool
) -> None:
    """An ANALYZE of the events that ran while every event it sampled was uncommitted (a large
    publish in flight, or one rolled back) records the chunk's pages and no rows. Planned as a
    join on that estimate of one event, a claim of 100 read the whole chunk: hashed it on the
    default path (17 ms at 20,000 events), scanned it once per claimed row on the append-only
    path (690 ms). It reads each claimed row's event by key instead."""
    bus = pg_target.bus(append_only=append_only)
    bus.subscribe(OrderPlaced, name="h")(_noop)
    s = f'"{pg_target.schema}"'
    holder, other = await asyncpg.connect(pg_target.dsn), await asyncpg.connect(pg_target.dsn)
    try:
        await bus.migrate()
        sub_id = (await bus.register())["h"]
        backend = bus.backend
        assert isinstance(backend, PostgresBackend)
        publish = holder.transaction()
        await publish.start()
        await holder.execute(
            f"INSERT INTO {s}.events (event_type, payload) "
            "SELECT 'order.placed', '\\x7b7d'::bytea FROM generate_series(1, 2000)"
        )
        await other.execute(f"ANALYZE {s}.events")
        await publish.rollback()
        await bus.publish_many([OrderPlaced(order_id=f"o{i}") for i in range(2000)])
        stats = await other.fetchrow(
            "SELECT sum(relpages) AS pages, sum(reltuples) AS tuples FROM pg_class "
            "WHERE oid IN (SELECT relid FROM pg_partition_tree($1::regclass))",
            f"{s}.events",
        )
        assert stats is not None and stats["pages"] > 0 and stats["tuples"] == 0
        args: tuple[object, ...]
        if append_only:
            query, args = backend.db.q["ring_claim"], ([0], sub_id, 0, 100, uuid.uuid4(), uuid.uuid4(), 60.0)
        else:
            widest = 36_000.0  # later than any row's place
            query, args = backend.db.q["claim"], (sub_id, 100, 60.0, uuid.uuid4(), uuid.uuid4(), widest)
        (plan,) = json.loads(await other.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + query, *args))
    finally:
        await holder.close()
        await other.close()
        await bus.aclose()
    assert plan["Plan"]["Actual Rows"] == 100
    assert rows_read(plan, "events") == 100  # one event read per claimed row
