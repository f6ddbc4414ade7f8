"""eventbus throughput and latency on one database.

    python -m benchmarks.throughput --dsn postgresql://postgres@127.0.0.1:5432/test --json out.json
    python -m benchmarks.throughput --dsn sqlite:///bench.db

Scenarios: end-to-end drain (no-op and 1 ms handlers, several concurrency and
batch settings, median of 3), publish rate (single and batches of 1,000),
idle wake-up latency (publish commit -> handler start), fan-out (1, 3, 10
subscriptions). Each run uses a scratch schema or file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import anyio

from eventbus import Context, Envelope, Worker
from eventbus.bench import BenchEvent, drain_throughput, scratch_bus


def _summary(rates: list[float]) -> dict[str, Any]:
    return {"runs": rates, "median": statistics.median(rates), "min": min(rates), "max": max(rates)}


async def drain(
    dsn: str, n: int, runs: int, settings: list[tuple[int, int, float, int]]
) -> list[dict[str, Any]]:
    out = []
    for concurrency, batch, sleep, subs in settings:
        rates = []
        for _ in range(runs):
            r = await drain_throughput(dsn, n, concurrency=concurrency, batch_size=batch,
                                       subscriptions=subs, handler_sleep_seconds=sleep)
            rates.append(r["deliveries_per_second"])
        out.append({"scenario": "drain_1ms" if sleep else "drain_noop", "n": n,
                    "concurrency": concurrency, "batch_size": batch, "subscriptions": subs,
                    "unit": "deliveries/s", **_summary(rates)})
        print(out[-1])
    return out


async def publish_rates(dsn: str, single: int, batched: int) -> list[dict[str, Any]]:
    bus = await scratch_bus(dsn)
    try:
        t0 = time.perf_counter()
        for i in range(single):
            await bus.publish(BenchEvent(n=i))
        t1 = time.perf_counter()
        for start in range(0, batched, 1000):
            await bus.publish_many(Envelope(BenchEvent(n=i)) for i in range(start, start + 1000))
        t2 = time.perf_counter()
    finally:
        await bus.aclose()
    return [
        {"scenario": "publish_single", "n": single, "unit": "events/s", "median": single / (t1 - t0)},
        {"scenario": "publish_batch_1000", "n": batched, "unit": "events/s",
         "median": batched / (t2 - t1)},
    ]


async def wakeup_latency(dsn: str, samples: int) -> dict[str, Any]:
    bus = await scratch_bus(dsn)
    latencies: list[float] = []
    sent: list[float] = [0.0]
    got = anyio.Event()

    @bus.subscribe(BenchEvent, name="wake")
    async def wake(event: BenchEvent, ctx: Context) -> None:
        nonlocal got
        latencies.append(time.perf_counter() - sent[0])
        got.set()

    worker = Worker(bus, poll_interval_seconds=30)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await anyio.sleep(1.0)
            for i in range(samples):
                got = anyio.Event()
                await anyio.sleep(0.01)  # idle between events
                sent[0] = time.perf_counter()
                await bus.publish(BenchEvent(n=i))
                with anyio.fail_after(10):
                    await got.wait()
            worker.stop()
    finally:
        await bus.aclose()
    ms = sorted(x * 1000 for x in latencies)
    return {"scenario": "wakeup_idle", "n": samples, "unit": "ms",
            "p50": ms[len(ms) // 2], "p99": ms[int(len(ms) * 0.99) - 1]}


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    settings = [(100, 100, 0.0, 1), (200, 100, 0.0, 1), (50, 50, 0.0, 1), (200, 100, 0.001, 1)]
    fanout = [(100, 100, 0.0, 3), (100, 100, 0.0, 10)]
    results = await drain(args.dsn, args.n, args.runs, settings)
    results += await drain(args.dsn, args.n // 2, 1, fanout)
    results += await publish_rates(args.dsn, 2000, args.n)
    results.append(await wakeup_latency(args.dsn, args.samples))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    out = anyio.run(main, ns)
    for row in out:
        print(row)
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(out, f, indent=2)
