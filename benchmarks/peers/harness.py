"""Scenario drivers shared by every peer script.

A peer script supplies an `Adapter` (its documented public API behind five calls);
this module turns it into the drain / publish / wake-up measurements. Every run
starts on a freshly recreated database, so runs do not inherit bloat.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any, Protocol

import asyncpg

from benchmarks.cpu import CpuMeter
from benchmarks.peers.common import Countdown, analyze_database, now, percentile, record

BATCH = 1_000  # batch size for every batch enqueue


class Adapter(Protocol):
    dsn: str

    async def open(self) -> None: ...  # recreate DB, install schema, connect
    async def close(self) -> None: ...
    async def enqueue_one(self, i: int) -> None: ...
    async def enqueue_many(self, start: int, count: int) -> None: ...
    async def start_worker(self, on_job: Callable[[], None], sleep_s: float) -> None: ...
    async def stop_worker(self) -> None: ...
    async def remaining(self) -> int: ...  # jobs not yet completed, for a sanity check


Factory = Callable[[], Adapter]


async def enqueue_all(a: Adapter, n: int) -> None:
    for start in range(0, n, BATCH):
        await a.enqueue_many(start, min(BATCH, n - start))


async def drain_once(
    make: Factory, n: int, sleep_s: float, timeout: float, cpu: CpuMeter | None = None
) -> float:
    """Pre-enqueue n jobs, start one worker, time until the handler has finished n (with ``cpu``,
    the CPU time of the same window)."""
    a = make()
    await a.open()
    try:
        await enqueue_all(a, n)
        await analyze_database(a.dsn)
        countdown = Countdown(n)
        if cpu is not None:
            cpu.start()
        t0 = now()
        await a.start_worker(countdown.hit, sleep_s)
        reached = await countdown.wait(timeout)
        elapsed = (countdown.done_at or now()) - t0
        if cpu is not None:
            cpu.stop()
        await a.stop_worker()
        left = await a.remaining()
    finally:
        await a.close()
    rate = countdown.count / elapsed
    print(
        f"  drain n={n} sleep={sleep_s}: {rate:,.0f}/s handled={countdown.count}"
        f" left_in_db={left}{'' if reached else ' TIMEOUT'}",
        flush=True,
    )
    return rate


_COUNTERS = """
SELECT pg_current_wal_lsn()::text AS lsn,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
       coalesce(sum(n_tup_upd + n_tup_del), 0)::bigint AS writes,
       coalesce(sum(n_dead_tup), 0)::bigint AS dead
FROM pg_stat_user_tables
"""


async def _counters(dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return dict(await conn.fetchrow(_COUNTERS))
    finally:
        await conn.close()


# The WAL records of the transactions that wrote to this (benchmark-only) database,
# their commit records included, plus records on its relations without a
# transaction (page pruning, vacuum): the run's own WAL, whatever other
# databases of the cluster wrote meanwhile.
_OWN_WAL = """
WITH r AS (
    SELECT xid, record_length,
           coalesce(block_ref, '') ~ ('rel \\d+/' || (SELECT oid FROM pg_database
                                                      WHERE datname = current_database()) || '/') AS touches
    FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
), ours AS (SELECT DISTINCT xid FROM r WHERE touches AND xid <> 0)
SELECT coalesce(sum(record_length), 0)::bigint FROM r WHERE touches OR xid IN (SELECT xid FROM ours)
"""


async def own_wal(dsn: str, before: str, after: str) -> int | None:
    """WAL bytes the run wrote to its database (None without the pg_walinspect extension)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        return int(await conn.fetchval(_OWN_WAL, before, after))
    except asyncpg.PostgresError:
        return None
    finally:
        await conn.close()


async def cost_once(make: Factory, n: int, timeout: float) -> dict[str, float | None]:
    """WAL bytes, dead tuples, row writes and commits per event over a drain.

    Statistics are read after the worker's connections closed (a backend
    flushes its counters when it exits), so they cover the whole drain. A
    temporary replication slot keeps the drain's WAL until it is read.
    """
    a = make()
    await a.open()
    keeper = await asyncpg.connect(a.dsn)
    try:
        await keeper.execute("SELECT pg_create_physical_replication_slot('bench_cost_wal', true, true)")
        try:
            await enqueue_all(a, n)
            await analyze_database(a.dsn)
            await asyncio.sleep(1.5)
            before = await _counters(a.dsn)
            countdown = Countdown(n)
            await a.start_worker(countdown.hit, 0.0)
            await countdown.wait(timeout)
            await a.stop_worker()
        finally:
            await a.close()
        await asyncio.sleep(1.5)
        after = await _counters(a.dsn)
        return await _cost_per_event(a.dsn, before, after, n)
    finally:
        await keeper.close()  # the temporary slot goes with it


async def _cost_per_event(
    dsn: str, before: dict[str, Any], after: dict[str, Any], n: int
) -> dict[str, float | None]:
    conn = await asyncpg.connect(dsn)
    try:
        wal = await conn.fetchval("SELECT $1::text::pg_lsn - $2::text::pg_lsn", after["lsn"], before["lsn"])
    finally:
        await conn.close()
    per: dict[str, float | None] = {k: (after[k] - before[k]) / n for k in ("commits", "writes", "dead")}
    own = await own_wal(dsn, before["lsn"], after["lsn"])
    per["own_wal_bytes"] = None if own is None else own / n
    print(f"  cost n={n}: wal {float(wal) / n:.0f} B/event {per}", flush=True)
    return {"wal_bytes": float(wal) / n, **per}


async def publish_once(make: Factory, n: int, batch: bool) -> float:
    """Publish n jobs, one enqueue call per job or in batches of BATCH."""
    a = make()
    await a.open()
    try:
        t0 = now()
        if batch:
            await enqueue_all(a, n)
        else:
            for i in range(n):
                await a.enqueue_one(i)
        rate = n / (now() - t0)
    finally:
        await a.close()
    print(f"  publish n={n} batch={batch}: {rate:,.0f}/s", flush=True)
    return rate


async def wakeup_samples(make: Factory, samples: int, warmup: int = 5) -> list[float]:
    """Idle worker; enqueue one job at a time; ms from enqueue-commit to handler start."""
    a = make()
    await a.open()
    seen: list[float] = []
    event = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_job() -> None:  # may run on a peer's own thread: hand the wake-up to our loop
        seen.append(now())
        loop.call_soon_threadsafe(event.set)

    rng = random.Random(42)
    out: list[float] = []
    try:
        await a.start_worker(on_job, 0.0)
        await asyncio.sleep(1.0)  # let the worker reach its idle wait
        for k in range(samples + warmup):
            await asyncio.sleep(rng.uniform(0.02, 0.08))  # idle gap, de-phased from polls
            event.clear()
            await a.enqueue_one(k)
            committed = now()
            await asyncio.wait_for(event.wait(), 10.0)
            if k >= warmup:
                out.append((seen[-1] - committed) * 1000)
        await a.stop_worker()
    finally:
        await a.close()
    return out


async def run_all(
    system: str,
    args: Any,
    drain_settings: dict[str, Factory],
    default: Factory,
) -> list[dict[str, Any]]:
    """Run the selected scenarios; `drain_settings` maps a setting label to a factory."""
    recs: list[dict[str, Any]] = []
    if "drain" in args.parts:
        for label, make in drain_settings.items():
            for scenario, sleep_s in (("drain_noop", 0.0), ("drain_1ms", 0.001)):
                runs = [await drain_once(make, args.n, sleep_s, args.timeout) for _ in range(args.runs)]
                recs.append(record(system, scenario, label, runs, n=args.n))
    if "publish" in args.parts:
        for scenario, n, batch in (
            ("publish_single", args.single_n, False),
            ("publish_batch", args.n, True),
        ):
            runs = [await publish_once(default, n, batch) for _ in range(args.runs)]
            setting = f"batch={BATCH}" if batch else "one enqueue call per job"
            recs.append(record(system, scenario, setting, runs, n=n))
    if "cost" in args.parts:
        cost = await cost_once(default, args.n, args.timeout)
        recs.append(
            record(
                system,
                "cost_per_event",
                "default",
                [float(cost["wal_bytes"] or 0.0)],
                n=args.n,
                unit="WAL bytes/event",
                note=json.dumps(cost),
            )
        )
    if "wakeup" in args.parts:
        lat = await wakeup_samples(default, args.samples)
        recs.append(
            record(
                system,
                "wakeup_idle",
                "default",
                [percentile(lat, 50)],
                n=args.samples,
                unit="ms",
                samples=lat,
            )
        )
    return recs
