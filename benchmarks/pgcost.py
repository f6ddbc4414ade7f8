"""PostgreSQL robustness figures for eventbus.

    python -m benchmarks.pgcost --dsn postgresql://postgres@127.0.0.1:5432/test --json out.json

(Cost per event, WAL bytes and dead tuples, is measured for eventbus and the
peers alike by ``benchmarks.peers`` with ``--only cost``.)

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

from eventbus import Bus, Context, Envelope, Worker
from eventbus.testing import BenchEvent, drain_throughput, temporary_bus


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
    ratio = held.deliveries_per_second / clean.deliveries_per_second
    return {
        "scenario": "held_xmin",
        "n": n,
        "clean": clean.deliveries_per_second,
        "held": held.deliveries_per_second,
        "ratio": ratio,
    }


async def steady_pickup(dsn: str, rate: int, seconds: float) -> dict[str, Any]:
    """A producer at `rate` events/s (ticks of 10 ms); latency commit -> handler start."""
    async with temporary_bus(dsn, max_pool_size=8) as bus:
        latencies, sent, achieved = await _pickup(bus, rate, seconds)
    ms = sorted(x * 1000 for x in latencies)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(len(ms) * p))]

    return {
        "scenario": "steady_pickup",
        "rate": rate,
        "achieved_rate": achieved,
        "handled": len(ms),
        "sent": sent,
        "unit": "ms",
        "p50": pct(0.50),
        "p95": pct(0.95),
        "p99": pct(0.99),
    }


async def _pickup(bus: Bus, rate: int, seconds: float) -> tuple[list[float], int, float]:
    """Publish at ``rate`` for ``seconds`` with a worker running: latencies, events sent, rate achieved."""
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
    return latencies, ticks * per_tick, achieved


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = [await held_xmin(args.dsn, args.n)]
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
