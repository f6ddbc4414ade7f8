"""Kill soak: SIGKILL random workers mid-run and restart them; nothing is lost.

Workload: 1,600 ``fault.order`` (each emits one keyed ``fault.followup``) and
400 ``fault.audit`` events, so 3,600 deliveries, served by 3 worker processes
with a 2 s lease. One worker is SIGKILLed every 0.5-1 s (8 kills) and
restarted at once. Afterwards, with SQL: lost 0, nothing stuck, every
delivery completed (or dead with its error) exactly once, one follow-up per
order key, every completed delivery's handler ran at least once.

Measured and printed (``pytest -s``): kill-to-reclaim p50/p99 (SIGKILL to the
killed worker's orphaned rows being claimed again, by the database clock) and
throughput of the soak against a clean run of the same workload.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid

import asyncpg
import pytest

from eventbus import Envelope

from ...apps.fault_events import Audit, Order
from ...conftest import Target
from ._support import Procs, drained, percentile, prepare, settled, wait_until, worker_id_of

ORDERS = 1600
AUDITS = 400
WORKERS = 3
WORKER_ARGS = ("--concurrency", "10", "--batch-size", "10", "--poll-interval", "1", "--grace", "2")
WORKER_ENV = {"FAULT_LEASE": "2", "FAULT_SLEEP": "0.05"}


async def _publish_workload(target: Target) -> None:
    bus = target.bus()
    async with bus:
        events = [Envelope(Order(n=i), key=f"o{i}") for i in range(ORDERS)]
        events += [Envelope(Audit(n=i), key=f"a{i}") for i in range(AUDITS)]
        random.Random(7).shuffle(events)
        for i in range(0, len(events), 250):
            results = await bus.publish_many(events[i : i + 250])
            assert not any(r.duplicate for r in results)


async def _start_workers(procs: Procs, db: asyncpg.Connection, schema: str) -> list:
    workers = [procs.worker(*WORKER_ARGS, env=WORKER_ENV, name=f"w{i}") for i in range(WORKERS)]
    for w in workers:
        await worker_id_of(db, schema, w.pid)
    return workers


async def _throughput(db: asyncpg.Connection, s: str) -> tuple[float, float, int]:
    row = await db.fetchrow(
        f"SELECT min(at) FILTER (WHERE new_status = 'processing') AS first, "
        f"max(at) FILTER (WHERE new_status = 'completed') AS last, "
        f"count(*) FILTER (WHERE new_status = 'completed') AS done "
        f'FROM "{s}".transitions'
    )
    assert row is not None
    elapsed = (row["last"] - row["first"]).total_seconds()
    return row["done"] / elapsed, elapsed, row["done"]


async def check_ended(db: asyncpg.Connection, s: str, rows: str = "deliveries") -> dict[str, int]:
    """What every kill soak checks once its workload ended, over ``rows`` (``deliveries``, or the
    append-only path's ``delivery_rows``, which shows every delivery wherever it lives); returns
    the deliveries per status."""
    counts = {r[0]: r[1] for r in await db.fetch(f'SELECT status, count(*) FROM "{s}".{rows} GROUP BY 1')}
    # Nothing stuck; every delivery ended.
    assert set(counts) <= {"completed", "dead"}, counts
    # Lost 0: every order, audit and follow-up has its delivery.
    per_sub = {
        r[0]: r[1]
        for r in await db.fetch(
            f'SELECT s.name, count(*) FROM "{s}".{rows} d '
            f'JOIN "{s}".subscriptions s ON s.id = d.subscription_id GROUP BY 1'
        )
    }
    assert per_sub == {"order": ORDERS, "audit": AUDITS, "followup": ORDERS}, per_sub
    assert await db.fetchval(f'SELECT count(*) FROM "{s}".events') == ORDERS * 2 + AUDITS
    # Dead rows (out of attempts after repeated kills) carry their error.
    assert (
        await db.fetchval(
            f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'dead' "
            "AND (last_error IS NULL OR last_error = '')"
        )
        == 0
    )
    # Follow-ups: exactly one per order key, caused by that order.
    missing = await db.fetchval(
        f"SELECT count(*) FROM \"{s}\".events o WHERE o.event_type = 'fault.order' "
        f"AND NOT EXISTS (SELECT 1 FROM \"{s}\".events f WHERE f.event_type = 'fault.followup' "
        "AND f.key = 'f:' || o.key AND f.causation_id = o.id)"
    )
    assert missing == 0
    assert (
        await db.fetchval(
            f'SELECT count(*) FROM (SELECT key FROM "{s}".events WHERE event_type = '
            "'fault.followup' GROUP BY key HAVING count(*) > 1) t"
        )
        == 0
    )
    # Every completed delivery's handler ran (a recorded start and end).
    assert (
        await db.fetchval(
            f"SELECT count(*) FROM \"{s}\".{rows} d WHERE d.status = 'completed' AND NOT "
            f'EXISTS (SELECT 1 FROM "{s}".handler_runs r WHERE r.delivery_id = d.id '
            "AND r.phase = 'end')"
        )
        == 0
    )
    return counts


async def _check_invariants(db: asyncpg.Connection, s: str) -> None:
    await check_ended(db, s)
    # A delivery completed exactly once (one transition to completed).
    assert (
        await db.fetchval(
            f'SELECT count(*) FROM (SELECT delivery_id FROM "{s}".transitions '
            "WHERE new_status = 'completed' GROUP BY 1 HAVING count(*) <> 1) t"
        )
        == 0
    )
    assert (
        await db.fetchval(
            f"SELECT count(*) FROM \"{s}\".deliveries d WHERE d.status = 'completed' AND NOT "
            f'EXISTS (SELECT 1 FROM "{s}".transitions t WHERE t.delivery_id = d.id '
            "AND t.new_status = 'completed')"
        )
        == 0
    )


async def _clean_run(pg_dsn: str, tmp_path) -> tuple[float, float, int]:
    """The same workload without kills, in its own schema."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    target = Target("postgres", pg_dsn, schema)
    await prepare(target)
    procs = Procs(target, tmp_path)
    db = await asyncpg.connect(pg_dsn)
    try:
        await _start_workers(procs, db, schema)
        await _publish_workload(target)
        await drained(db, schema, "clean run")
        await _check_invariants(db, schema)
        return await _throughput(db, schema)
    finally:
        await procs.aclose()
        await db.execute(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')
        await db.close()


async def test_kill_soak(fault_target, procs, db, pg_dsn, tmp_path) -> None:
    s = fault_target.schema
    rng = random.Random(20240611)
    workers = await _start_workers(procs, db, s)
    await _publish_workload(fault_target)
    kills: list[tuple[object, object]] = []  # (worker id, database time of the SIGKILL)
    started = time.monotonic()
    while len(kills) < 8:
        await asyncio.sleep(rng.uniform(0.5, 1.0))
        if await settled(db, s):
            break
        i = rng.randrange(len(workers))
        victim = workers[i]
        wid = await db.fetchval(f'SELECT id FROM "{s}".workers WHERE pid = $1', victim.pid)
        at = await db.fetchval("SELECT clock_timestamp()")
        victim.signal(signal.SIGKILL)
        await victim.wait_async(5)
        kills.append((wid, at))
        workers[i] = procs.worker(*WORKER_ARGS, env=WORKER_ENV, name=f"w{i}")
    assert len(kills) >= 6, f"the workload ended after only {len(kills)} kills"
    await drained(db, s, "soak")
    soak_seconds = time.monotonic() - started
    await _check_invariants(db, s)

    # Kill-to-reclaim: each row a killed worker held (taken back by a rescue or by
    # lease expiry, attributed to it in delivery_attempts) until it was claimed again.
    reclaim: list[float] = []
    for wid, at in kills:
        rows = await db.fetch(
            f"SELECT extract(epoch FROM min(t.at) - $2)::float8 AS seconds "
            f'FROM "{s}".delivery_attempts a JOIN "{s}".transitions t '
            "ON t.delivery_id = a.delivery_id AND t.new_status = 'processing' AND t.at > $2 "
            "WHERE a.error_type IN ('LeaseExpired', 'WorkerLost') AND a.worker_id = $1 "
            "GROUP BY a.delivery_id",
            wid,
            at,
        )
        reclaim += [r["seconds"] for r in rows]
    dead = await db.fetchval(f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'dead'")
    orphans = await db.fetchval(
        f"SELECT count(*) FROM \"{s}\".delivery_attempts WHERE error_type IN ('LeaseExpired', 'WorkerLost')"
    )
    assert reclaim, "no orphaned rows were recorded; the kills hit idle workers only"
    soak_rate, soak_elapsed, done = await _throughput(db, s)
    clean_rate, clean_elapsed, clean_done = await _clean_run(pg_dsn, tmp_path)
    print(
        f"\nkill soak: {len(kills)} SIGKILLs, {orphans} orphaned rows, {dead} dead, "
        f"{len(reclaim)} reclaimed; kill-to-reclaim p50 {percentile(reclaim, 50):.2f}s "
        f"p99 {percentile(reclaim, 99):.2f}s max {max(reclaim):.2f}s\n"
        f"throughput: soak {soak_rate:.0f} deliveries/s ({done} in {soak_elapsed:.1f}s), "
        f"clean {clean_rate:.0f}/s ({clean_done} in {clean_elapsed:.1f}s); "
        f"soak wall time {soak_seconds:.1f}s"
    )
    # Lease 2 s + recovery sweep every 1 s + claim, with workers restarting: bounded.
    assert max(reclaim) < 15


@pytest.mark.soak
async def test_kill_soak_long(fault_target, procs, db) -> None:
    """Harder soak: kills every 0.3-0.8 s (unseeded) until the workload drains."""
    s = fault_target.schema
    rng = random.Random()
    workers = await _start_workers(procs, db, s)
    await _publish_workload(fault_target)
    kills = 0
    while not await settled(db, s) and kills < 40:
        await asyncio.sleep(rng.uniform(0.3, 0.8))
        i = rng.randrange(len(workers))
        workers[i].signal(signal.SIGKILL)
        await workers[i].wait_async(5)
        kills += 1
        workers[i] = procs.worker(*WORKER_ARGS, env=WORKER_ENV, name=f"w{i}")
    await wait_until(lambda: settled(db, s), 90, interval=0.2, what="soak to finish")
    await _check_invariants(db, s)
