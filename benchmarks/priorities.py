"""Drain rate with mixed priorities against none, on SQLite and PostgreSQL in one run.

    python -m benchmarks.priorities --dsn postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.priorities --dsn postgresql://postgres@127.0.0.1:5432/test --n 20000 --json out.json

Each run publishes ``n`` events into a scratch schema or file (in batches of
1,000), then times one burst drain by one worker. "none" publishes every event
at priority 0; "mixed" gives event ``i`` priority ``i % 10``. The runs
alternate none, mixed on each backend, so drift of the machine falls on both
alike. For the mixed runs the report also gives, per priority, the mean
position (0 = first, 1 = last) at which its events were handled: with the
default step (60 s) and a backlog younger than a minute, priority 0 runs
first and 9 last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import anyio

from eventbus import Context, Envelope
from eventbus.testing import BenchEvent, drain, temporary_bus

LEVELS = 10


async def one_run(dsn: str | None, n: int, mixed: bool, concurrency: int, batch_size: int) -> dict[str, Any]:
    """Publish ``n`` events, drain them; the rate and, when mixed, the mean handled position per priority."""
    pool: dict[str, Any] = {} if dsn is None or dsn.startswith("sqlite:") else {"max_pool_size": 8}
    handled: list[int] = []
    async with temporary_bus(dsn, **pool) as bus:

        @bus.subscribe(BenchEvent, name="bench-priorities")
        async def handler(event: BenchEvent, ctx: Context) -> None:
            handled.append(event.n)

        await bus.register()
        for start in range(0, n, 1000):
            await bus.publish_many(
                Envelope(BenchEvent(n=i), priority=i % LEVELS if mixed else 0)
                for i in range(start, min(n, start + 1000))
            )
        await bus.backend.schema.analyze()
        started = time.perf_counter()
        await drain(bus, wait_for_scheduled=False, concurrency=concurrency, batch_size=batch_size)
        seconds = time.perf_counter() - started
        kind = bus.backend.kind
    positions: dict[int, list[float]] = {}
    for place, i in enumerate(handled):
        positions.setdefault(i % LEVELS, []).append(place / max(1, len(handled) - 1))
    return {
        "backend": kind,
        "rate": round(n / seconds),
        "mean_position": {p: round(statistics.mean(v), 3) for p, v in sorted(positions.items())}
        if mixed
        else None,
    }


async def compare(
    dsns: list[str | None], n: int, runs: int, concurrency: int, batch_size: int
) -> dict[str, Any]:
    report: dict[str, Any] = {"n": n, "runs": runs, "concurrency": concurrency, "batch_size": batch_size}
    for dsn in dsns:
        rates: dict[str, list[int]] = {"none": [], "mixed": []}
        order: dict[int, float] = {}
        kind = "?"
        for _ in range(runs):
            for mode in rates:
                result = await one_run(dsn, n, mode == "mixed", concurrency, batch_size)
                kind = result["backend"]
                rates[mode].append(result["rate"])
                order = result["mean_position"] or order
                print(f"{kind} {mode}: {result['rate']:,} deliveries/s")
        medians = {mode: statistics.median(values) for mode, values in rates.items()}
        report[kind] = {
            "unit": "deliveries/s",
            "runs": rates,
            "median": medians,
            "mixed_over_none": round(medians["mixed"] / medians["none"], 3),
            "mean_position_by_priority_last_mixed_run": order,
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="the PostgreSQL server (SQLite runs on a scratch file)")
    parser.add_argument("--n", type=int, default=10000, help="events per run")
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind, alternating")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    report = anyio.run(compare, [None, args.dsn], args.n, args.runs, args.concurrency, args.batch_size)
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
