"""Drain and publish through a pooler against direct, side by side, alternating.

    python -m benchmarks.poolers \
        --target direct=postgresql://postgres@127.0.0.1:5432/test \
        --target direct-nocache='postgresql://postgres@127.0.0.1:5432/test?pooler=transaction' \
        --target pgbouncer-session='postgresql://postgres@127.0.0.1:6432/test?pooler=session' \
        --target pgbouncer-transaction='postgresql://postgres@127.0.0.1:6432/test?pooler=transaction' \
        --rounds 3 --json out.json

Each round runs every target once, in the order given, so a machine that gets
busier or quieter during the run weighs on all of them alike. Per target and
round: ``eventbus.testing.drain_throughput`` (``--n`` events published in
batches of 1,000, then drained by one worker: publish events/s and drain
deliveries/s) and ``--lone`` single publishes one after another (publishes/s,
the round trips of one publish). The PgBouncer is the caller's: start it with
``pool_mode = transaction`` (or ``session``) in front of the same server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import anyio

from eventbus.testing import BenchEvent, drain_throughput, temporary_bus


async def lone_publishes(dsn: str, count: int) -> float:
    """Publishes/s of ``count`` single publishes, each awaited before the next (no coalescing)."""
    async with temporary_bus(dsn, max_pool_size=4, coalesce_publishes=False) as bus:
        await bus.publish(BenchEvent(n=-1))  # the pool and the held connection are up
        started = time.perf_counter()
        for i in range(count):
            await bus.publish(BenchEvent(n=i))
        return count / (time.perf_counter() - started)


async def one_round(name: str, dsn: str, n: int, lone: int) -> dict[str, Any]:
    drained = await drain_throughput(dsn, n)
    return {
        "target": name,
        "publish_batched_per_second": round(drained.publish_per_second),
        "drain_deliveries_per_second": round(drained.deliveries_per_second),
        "lone_publishes_per_second": round(await lone_publishes(dsn, lone)),
    }


def summary(rows: list[dict[str, Any]], targets: list[str]) -> list[dict[str, Any]]:
    """Median and range of each figure per target."""
    out = []
    for name in targets:
        mine = [r for r in rows if r["target"] == name]
        figures = {}
        for key in ("publish_batched_per_second", "drain_deliveries_per_second", "lone_publishes_per_second"):
            values = [r[key] for r in mine]
            figures[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        out.append({"target": name, "rounds": len(mine), **figures})
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    targets = [t.split("=", 1) for t in args.target]
    rows = []
    for _ in range(args.rounds):
        for name, dsn in targets:
            rows.append(await one_round(name, dsn, args.n, args.lone))
            print(rows[-1], flush=True)
    return {"n": args.n, "lone": args.lone, "rounds": rows, "summary": summary(rows, [t[0] for t in targets])}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", action="append", required=True, help="NAME=DSN (repeatable)")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--lone", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    result = anyio.run(main, ns)
    for row in result["summary"]:
        print(row)
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(result, f, indent=2)
