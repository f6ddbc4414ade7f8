"""End-to-end drain with several worker processes on PostgreSQL.

    python -m benchmarks.processes --dsn postgresql://postgres@127.0.0.1:5432/test --processes 2

Publishes N events beforehand, then starts P `eventbus worker --burst`
processes on this module's bus (one no-op subscription) and times until the
last one exits (process start-up included, reported separately).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import anyio

from eventbus import Bus, Context, Envelope
from eventbus.cli.bench import BenchEvent, scratch_bus

SCHEMA = "eventbus_bench"

bus = Bus(schema=SCHEMA) if os.environ.get("EVENTBUS_DSN") else None


if bus is not None:

    @bus.subscribe(BenchEvent, name="bench-0")
    async def handle(event: BenchEvent, ctx: Context) -> None:
        pass


async def prepare(dsn: str, n: int) -> None:
    scratch = await scratch_bus(dsn, SCHEMA)
    try:

        @scratch.subscribe(BenchEvent, name="bench-0")
        async def handle(event: BenchEvent, ctx: Context) -> None:
            pass

        await scratch.register()
        for start in range(0, n, 1000):
            await scratch.publish_many(Envelope(BenchEvent(n=i)) for i in range(start, min(n, start + 1000)))
    finally:
        await scratch.aclose()


def drain(dsn: str, processes: int, concurrency: int, batch: int) -> float:
    env = dict(os.environ, EVENTBUS_DSN=dsn, EVENTBUS_SCHEMA=SCHEMA)
    cmd = [
        sys.executable,
        "-m",
        "eventbus",
        "worker",
        "benchmarks.processes:bus",
        "--burst",
        "--concurrency",
        str(concurrency),
        "--batch-size",
        str(batch),
    ]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL) for _ in range(processes)]
    for p in procs:
        p.wait(timeout=300)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=40_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    startup = []
    anyio.run(prepare, args.dsn, 0)
    startup.append(drain(args.dsn, args.processes, args.concurrency, args.batch_size))
    rates = []
    for _ in range(args.runs):
        anyio.run(prepare, args.dsn, args.n)
        rates.append(args.n / drain(args.dsn, args.processes, args.concurrency, args.batch_size))
    print(
        f"{args.processes} processes: median {statistics.median(rates):,.0f} events/s "
        f"(runs {[round(r) for r in rates]}; start-up and exit on an empty queue "
        f"{startup[0]:.2f}s, included)"
    )


if __name__ == "__main__":
    main()
