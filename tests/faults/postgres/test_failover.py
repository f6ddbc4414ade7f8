"""Primary failover with a synchronous standby, under a publisher and two worker processes.

A throwaway primary and a streaming standby (``pg_basebackup -R``) run from
the local binaries, never the shared server; ``synchronous_standby_names``
makes every commit wait for the standby. Publisher and workers use one
multi-host DSN with ``target_session_attrs=read-write``. Mid-run the primary
is stopped with ``pg_ctl stop -m immediate`` and the standby promoted: the
workers (not restarted) and the publisher carry on against the new primary;
every acknowledged publish is there and processed exactly once to completion,
and every completion the old primary had acknowledged is still there.
"""

from __future__ import annotations

import asyncio
import time
import traceback

import asyncpg

from eventbus import BackendError, Envelope

from ...apps.fault_events import Order
from ...conftest import Target
from ...support.pgserver import PgServer
from ._support import Procs, prepare, wait_until, worker_id_of


async def _make_synchronous(primary: PgServer) -> None:
    conn = await asyncpg.connect(primary.dsn)
    try:
        await wait_until(
            lambda: conn.fetchval("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"),
            60,
            what="the standby streaming",
        )
        await conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        await conn.execute("SELECT pg_reload_conf()")
        await wait_until(
            lambda: conn.fetchval("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"),
            60,
            what="the standby synchronous",
        )
    finally:
        await conn.close()


async def _completed_on_standby(dsn: str, schema: str) -> set[int]:
    """Deliveries completed on the primary, every one of them already on the synchronous standby.

    The read is followed by a write in the same transaction: its commit returns
    once the standby has flushed the WAL up to it, which includes every commit
    the read saw.
    """
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            rows = await conn.fetch(f"SELECT id FROM \"{schema}\".deliveries WHERE status = 'completed'")
            await conn.execute(f'CREATE TABLE "{schema}".failover_mark ()')
        return {r["id"] for r in rows}
    finally:
        await conn.close()


async def test_failover_to_a_synchronous_standby_loses_nothing_acknowledged(tmp_path) -> None:
    primary = await asyncio.to_thread(lambda: PgServer().start())
    standby: PgServer | None = None
    procs: Procs | None = None
    try:
        standby = await asyncio.to_thread(lambda: PgServer().start_standby_of(primary))
        await _make_synchronous(primary)
        hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        dsn = f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
        s = "failover"
        target = Target("postgres", dsn, s)
        await prepare(target)
        procs = Procs(target, tmp_path)
        env = {"FAULT_LEASE": "5", "FAULT_SLEEP": "0.01"}
        workers = [procs.worker("--poll-interval", "1", env=env, name=f"w{i}") for i in range(2)]
        db = await asyncpg.connect(dsn)
        try:
            for w in workers:
                await worker_id_of(db, s, w.pid)
        finally:
            await db.close()

        acked: dict[str, int] = {}
        ack_times: list[float] = []
        errors: list[BaseException] = []
        stop = asyncio.Event()
        bus = target.bus()

        async def publisher() -> None:
            i = 0
            while not stop.is_set():
                key = f"p{i}"
                i += 1
                try:
                    (r,) = await asyncio.wait_for(bus.publish_many([Envelope(Order(n=i), key=key)]), 30)
                except Exception as exc:
                    errors.append(exc)
                    await asyncio.sleep(0.05)
                    continue
                acked[key] = r.event_id
                ack_times.append(time.monotonic())
                await asyncio.sleep(0.005)

        async with bus:
            task = asyncio.create_task(publisher())
            try:
                await wait_until(lambda: asyncio.sleep(0, len(acked) >= 200), 60, what="200 publishes")
                completed_before = await _completed_on_standby(primary.dsn, s)
                acked_before = len(acked)
                stopped_at = time.monotonic()
                await asyncio.to_thread(primary.stop, "immediate")
                await asyncio.to_thread(standby.promote)
                promoted_at = time.monotonic()
                clock = await asyncpg.connect(standby.dsn)
                try:
                    promoted_db_time = await clock.fetchval("SELECT clock_timestamp()")
                finally:
                    await clock.close()
                await wait_until(
                    lambda: asyncio.sleep(0, len(acked) >= acked_before + 200), 60, what="publishes resumed"
                )
            finally:
                stop.set()
                await asyncio.wait_for(task, 40)

        untyped = [e for e in errors if not isinstance(e, BackendError)]
        assert not untyped, "".join(traceback.format_exception(untyped[0])) + f"\n{len(untyped)} untyped"
        assert completed_before, "nothing was completed before the failover"

        db = await asyncpg.connect(standby.dsn)
        try:
            assert not await db.fetchval("SELECT pg_is_in_recovery()")

            async def processed() -> bool:
                n = await db.fetchval(
                    f'SELECT count(*) FROM "{s}".events e JOIN "{s}".deliveries d ON d.event_id = e.id '
                    f"JOIN \"{s}\".subscriptions sub ON sub.id = d.subscription_id AND sub.name = 'order' "
                    "WHERE e.key = ANY($1::text[]) AND d.status = 'completed'",
                    list(acked),
                )
                return n == len(acked)

            await wait_until(processed, 60, interval=0.2, what="acknowledged events processed")
            rows = await db.fetch(f"SELECT key, id FROM \"{s}\".events WHERE event_type = 'fault.order'")
            stored = {r["key"]: r["id"] for r in rows}
            lost = [k for k, v in acked.items() if stored.get(k) != v]
            assert not lost, f"{len(lost)} acknowledged publishes lost, e.g. {lost[:5]}"
            still = await db.fetch(
                f"SELECT id FROM \"{s}\".deliveries WHERE id = ANY($1::bigint[]) AND status = 'completed'",
                list(completed_before),
            )
            assert len(still) == len(completed_before), "an acknowledged completion is lost"
            twice = await db.fetchval(
                f'SELECT count(*) FROM (SELECT delivery_id FROM "{s}".transitions '
                "WHERE new_status = 'completed' GROUP BY 1 HAVING count(*) > 1) t"
            )
            assert twice == 0
            workers_resumed = await db.fetchval(
                f'SELECT extract(epoch FROM min(at) - $1)::float8 FROM "{s}".transitions '
                "WHERE new_status = 'completed' AND at > $1",
                promoted_db_time,
            )
        finally:
            await db.close()
        assert all(w.alive() for w in workers), "a worker died in the failover"
        assert workers_resumed is not None, "no worker completed anything on the new primary"
        resumed = min(t for t in ack_times if t > promoted_at) - promoted_at
        print(
            f"\nfailover: {len(acked)} acked ({acked_before} before the stop), {len(errors)} publishes "
            f"raised ({sorted({type(e).__name__ for e in errors})}); {len(completed_before)} completions "
            f"on the standby at the stop, all kept; stop+promote took {promoted_at - stopped_at:.1f}s, "
            f"first publish acked {resumed:.2f}s and first completion {workers_resumed:.2f}s after it"
        )
    finally:
        if procs is not None:
            await procs.aclose()
        if standby is not None:
            await asyncio.to_thread(standby.destroy)
        await asyncio.to_thread(primary.destroy)
