"""Drain rate with the throughput rollup on and off, side by side, on SQLite and PostgreSQL in one run.

    python -m benchmarks.rollup --dsn postgresql://postgres@127.0.0.1:5432/test --json out.json

Each run publishes ``n`` events into a scratch schema or file, then times one
burst drain by one worker (no-op handler, concurrency 200, batches of 100),
as ``eventbus.testing.drain_throughput`` does: its rate (deliveries per
second of wall time) and the CPU time this process spent per delivery during
the drain (the worker's side: PostgreSQL's own work is in its server, and
the CPU time is less disturbed by other load on the machine than the wall
time). "on" is the default bus, whose worker counts each run in its rollup
and appends the rollup when it stops; "off" is ``Bus(rollup=False)``. The
runs alternate off, on on each backend, so drift of the machine falls on
both alike; the report gives each mode's median, range and runs, and the
medians' change (``change_pct``). Beside them, the cost of one ``Rollup.add`` (the only work
the rollup adds per delivery), timed alone, and the time ``bus.throughput``
takes to read an hour and a day of a full rollup (10 subscriptions, 5
workers each writing a row per subscription and minute, a day of them: 72,000
rows with eight-bucket histograms, and a queue sample per subscription and
minute), median of five reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from typing import Any

import anyio

from eventbus import Context
from eventbus.backends.ports import RollupRow
from eventbus.testing import BenchEvent, drain, temporary_bus
from eventbus.throughput import COMPLETED, Rollup


def _summary(values: list[float], digits: int = 0) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits), "min": round(min(values), digits),
        "max": round(max(values), digits), "runs": [round(v, digits) for v in values],
    }  # fmt: skip


async def one_run(dsn: str | None, n: int, rollup: bool) -> tuple[str, float, float]:
    """(backend, deliveries per second, CPU microseconds per delivery) of one drain of ``n`` events."""
    pool: dict[str, Any] = {} if dsn is None or dsn.startswith("sqlite:") else {"max_pool_size": 8}
    async with temporary_bus(dsn, rollup=rollup, **pool) as bus:

        @bus.subscribe(BenchEvent, name="bench-rollup")
        async def handler(event: BenchEvent, ctx: Context) -> None:
            return None

        await bus.register()
        for start in range(0, n, 1000):
            await bus.publish_many(BenchEvent(n=i) for i in range(start, min(n, start + 1000)))
        await bus.backend.schema.analyze()
        wall, cpu = time.perf_counter(), time.process_time()
        await drain(bus, wait_for_scheduled=False, concurrency=200, batch_size=100)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return bus.backend.kind, n / wall, cpu / n * 1e6


def _change(off: dict[str, Any], on: dict[str, Any]) -> float:
    before, after = float(off["median"]), float(on["median"])
    return round(100 * (after - before) / before, 1)


async def backend(dsn: str | None, n: int, runs: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    kind = ""
    for _ in range(runs):
        for mode in ("off", "on"):
            kind, rate, us = await one_run(dsn, n, rollup=mode == "on")
            rates[mode].append(rate)
            cpu[mode].append(us)
    rate_off, rate_on = _summary(rates["off"]), _summary(rates["on"])
    cpu_off, cpu_on = _summary(cpu["off"], 1), _summary(cpu["on"], 1)
    result = {
        "backend": kind, "n": n,
        "deliveries_per_second": {"off": rate_off, "on": rate_on, "change_pct": _change(rate_off, rate_on)},
        "cpu_us_per_delivery": {"off": cpu_off, "on": cpu_on, "change_pct": _change(cpu_off, cpu_on)},
    }  # fmt: skip
    print(json.dumps(result))
    return result


class _Nothing:
    def add(self, subscription: str, outcome: int, seconds: float) -> None:
        return None


def add_cost_ns() -> float:
    """Nanoseconds per ``Rollup.add`` over ten subscriptions, less the same loop calling a no-op.

    Best of five runs of 200,000 calls each.
    """
    names, calls = [f"sub-{i}" for i in range(10)], 200_000

    def best(target: Rollup | _Nothing) -> float:
        def run() -> None:
            for i in range(calls):
                target.add(names[i % 10], COMPLETED, 0.0003 + (i % 97) * 0.0001)

        return min(timeit.repeat(run, number=1, repeat=5)) / calls * 1e9

    return best(Rollup()) - best(_Nothing())


async def read_cost(dsn: str | None, subscriptions: int = 10, workers: int = 5) -> dict[str, Any]:
    """Milliseconds ``bus.throughput`` takes over a day of a full rollup (see the module's docstring)."""
    async with temporary_bus(dsn) as bus:
        names = [f"sub-{i}" for i in range(subscriptions)]
        for name in names:
            bus.subscribe(BenchEvent, name=name)(_noop)
        await bus.register()
        now = int(time.time()) // 60 * 60
        rows = [
            RollupRow(name, now - 60 * m, 100 + w, 2, 1, {b: 10 + b for b in range(20, 28)})
            for m in range(1, 1441) for name in names for w in range(workers)
        ]  # fmt: skip
        for start in range(0, len(rows), 5000):
            await bus.backend.rollup.record(rows[start : start + 5000])
        await bus.backend.schema.analyze()
        out: dict[str, Any] = {"backend": bus.backend.kind, "rows": len(rows)}
        for window in ("1h", "1d"):
            times = []
            for _ in range(5):
                started = time.perf_counter()
                await bus.throughput(window=window)
                times.append((time.perf_counter() - started) * 1000)
            out[f"read_{window}_ms"] = _summary(times, 1)
    print(json.dumps(out))
    return out


async def _noop(event: BenchEvent, ctx: Context) -> None:
    return None


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results = [await backend(None, args.n, args.runs)]  # a temporary SQLite file
    results.append(await backend(args.dsn, args.n, args.runs))
    add = round(add_cost_ns())
    print(json.dumps({"rollup_add_ns": add}))
    reads = [await read_cost(None), await read_cost(args.dsn)]
    return {"drain": results, "rollup_add_ns": add, "reads": reads}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = anyio.run(main, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
