"""Drain rate of a transactional no-op handler against a plain one, runs alternating.

    python -m benchmarks.transactional --dsn postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.transactional --dsn sqlite:///bench.db --n 5000 --runs 3 --json out.json

A plain handler's completions are written in batches (one transaction for up
to 500 results); a transactional handler (``subscribe(..., transactional=True)``)
completes each delivery in a transaction of its own, opened before the handler
runs. Each run publishes ``n`` events into a scratch schema or file and times
one burst drain; plain and transactional runs alternate, so drift of the
machine (other load, caches, autovacuum) falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import anyio

from eventbus.testing import drain_throughput


async def compare(dsn: str, n: int, runs: int, concurrency: int, batch_size: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"plain": [], "transactional": []}
    for _ in range(runs):
        for kind in rates:
            result = await drain_throughput(
                dsn, n, concurrency=concurrency, batch_size=batch_size, transactional=kind == "transactional"
            )
            rates[kind].append(round(result.deliveries_per_second))
            print(f"{result.backend} {kind}: {result.deliveries_per_second:,.0f} deliveries/s")
    medians = {kind: statistics.median(values) for kind, values in rates.items()}
    return {
        "n": n,
        "concurrency": concurrency,
        "batch_size": batch_size,
        "unit": "deliveries/s",
        "runs": rates,
        "median": medians,
        "transactional_over_plain": round(medians["transactional"] / medians["plain"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--n", type=int, default=5000, help="events per run")
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind, alternating")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    report = anyio.run(compare, args.dsn, args.n, args.runs, args.concurrency, args.batch_size)
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
