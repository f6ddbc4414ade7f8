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
import uuid

import anyio
import anyio.to_thread

from eventbus import Bus, Context, Envelope
from eventbus.testing import BenchEvent, temporary_bus

# The worker processes' bus: the scratch schema comes in EVENTBUS_SCHEMA.
bus = Bus() if os.environ.get("EVENTBUS_DSN") else None


if bus is not None:

    @bus.subscribe(BenchEvent, name="bench-0")
    async def handle(event: BenchEvent, ctx: Context) -> None:
        pass


async def timed_run(args: argparse.Namespace, n: int) -> float:
    """Publish ``n`` events on a fresh schema, then drain them with the worker processes; seconds."""
    schema = f"eventbus_bench_{uuid.uuid4().hex[:12]}"
    async with temporary_bus(args.dsn, schema=schema, max_pool_size=8) as scratch:

        @scratch.subscribe(BenchEvent, name="bench-0")
        async def handle(event: BenchEvent, ctx: Context) -> None:
            pass

        await scratch.register()
        for start in range(0, n, 1000):
            await scratch.publish_many(Envelope(BenchEvent(n=i)) for i in range(start, min(n, start + 1000)))
        return await anyio.to_thread.run_sync(
            drain, args.dsn, schema, args.processes, args.concurrency, args.batch_size
        )


def drain(dsn: str, schema: str, processes: int, concurrency: int, batch: int) -> float:
    env = dict(os.environ, EVENTBUS_DSN=dsn, EVENTBUS_SCHEMA=schema)
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


async def measure(args: argparse.Namespace) -> None:
    startup = await timed_run(args, 0)
    rates = [args.n / await timed_run(args, args.n) for _ in range(args.runs)]
    print(
        f"{args.processes} processes: median {statistics.median(rates):,.0f} events/s "
        f"(runs {[round(r) for r in rates]}; start-up and exit on an empty queue "
        f"{startup:.2f}s, included)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=40_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    anyio.run(measure, parser.parse_args())


if __name__ == "__main__":
    main()
