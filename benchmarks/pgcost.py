"""PostgreSQL cost and robustness figures for eventbus.

    python -m benchmarks.pgcost --dsn postgresql://postgres@127.0.0.1:5432/test --json out.json

- cost per completed event: WAL bytes, dead tuples, HOT updates, commits;
- throughput while another connection holds back xmin (`BEGIN; SELECT txid_current()`);
- pickup latency under a steady producer (1,000/s and 5,000/s): p50/p95/p99.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio
import asyncpg

from eventbus import Context, Envelope, Worker
from eventbus.bench import BenchEvent, drain_throughput, scratch_bus

SCHEMA = "eventbus_bench"

_COUNTERS = f"""
SELECT pg_current_wal_lsn() AS lsn,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
       coalesce(sum(n_tup_upd), 0)::bigint AS updates,
       coalesce(sum(n_tup_hot_upd), 0)::bigint AS hot_updates,
       coalesce(sum(n_dead_tup), 0)::bigint AS dead
FROM pg_stat_user_tables WHERE schemaname = '{SCHEMA}'
"""


async def _counters(conn: asyncpg.Connection) -> dict[str, Any]:
    await anyio.sleep(1.2)  # let backends flush their statistics
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return dict(await conn.fetchrow(_COUNTERS))


async def cost_per_event(dsn: str, n: int) -> dict[str, Any]:
    """Publish n, drain n; the deltas over the drain, per completed event."""
    bus = await scratch_bus(dsn, SCHEMA)

    @bus.subscribe(BenchEvent, name="cost")
    async def cost(event: BenchEvent, ctx: Context) -> None:
        pass

    conn = await asyncpg.connect(dsn)
    try:
        await Worker(bus, burst=True).run()
        for start in range(0, n, 1000):
            await bus.publish_many(Envelope(BenchEvent(n=i)) for i in range(start, start + 1000))
        before = await _counters(conn)
        await Worker(bus, burst=True, concurrency=100, batch_size=100).run()
        after = await _counters(conn)
        wal = await conn.fetchval("SELECT $1::pg_lsn - $2::pg_lsn", after["lsn"], before["lsn"])
    finally:
        await conn.close()
        await bus.aclose()
    per = {k: (after[k] - before[k]) / n for k in ("commits", "updates", "hot_updates", "dead")}
    return {"scenario": "cost_per_event", "n": n, "wal_bytes": float(wal) / n, **per}


async def held_xmin(dsn: str, n: int) -> dict[str, Any]:
    """Drain throughput with and without a transaction holding back xmin."""
    clean = await drain_throughput(dsn, n, concurrency=100, batch_size=100)
    holder = await asyncpg.connect(dsn)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.fetchval("SELECT txid_current()")
        held = await drain_throughput(dsn, n, concurrency=100, batch_size=100)
        await tx.rollback()
    finally:
        await holder.close()
    ratio = held["deliveries_per_second"] / clean["deliveries_per_second"]
    return {"scenario": "held_xmin", "n": n, "clean": clean["deliveries_per_second"],
            "held": held["deliveries_per_second"], "ratio": ratio}


async def steady_pickup(dsn: str, rate: int, seconds: float) -> dict[str, Any]:
    """A producer at `rate` events/s (ticks of 10 ms); latency commit -> handler start."""
    bus = await scratch_bus(dsn, SCHEMA)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    all_handled = anyio.Event()
    per_tick, ticks = max(1, rate // 100), int(seconds * 100)

    @bus.subscribe(BenchEvent, name="steady")
    async def steady(event: BenchEvent, ctx: Context) -> None:
        latencies.append(time.perf_counter() - sent[event.n])
        if len(latencies) == ticks * per_tick:
            all_handled.set()

    worker = Worker(bus, concurrency=200, batch_size=100)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await anyio.sleep(1.0)
            start = time.perf_counter()
            for tick in range(ticks):
                await anyio.sleep(max(0.0, start + tick / 100 - time.perf_counter()))
                batch = range(tick * per_tick, (tick + 1) * per_tick)
                await bus.publish_many(Envelope(BenchEvent(n=i)) for i in batch)
                now = time.perf_counter()
                sent.update((i, now) for i in batch)
            achieved = ticks * per_tick / (time.perf_counter() - start)
            with anyio.move_on_after(10):
                await all_handled.wait()
            worker.stop()
    finally:
        await bus.aclose()
    ms = sorted(x * 1000 for x in latencies)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(len(ms) * p))]

    return {"scenario": "steady_pickup", "rate": rate, "achieved_rate": achieved,
            "handled": len(ms), "sent": ticks * per_tick, "unit": "ms",
            "p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)}


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = [await cost_per_event(args.dsn, args.n)]
    print(results[-1])
    results.append(await held_xmin(args.dsn, args.n))
    print(results[-1])
    for rate in (1000, 5000):
        results.append(await steady_pickup(args.dsn, rate, args.seconds))
        print(results[-1])
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    out = anyio.run(main, ns)
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(out, f, indent=2)
