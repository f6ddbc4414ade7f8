"""Drain rate with the throughput rollup on and off, side by side, on SQLite and PostgreSQL in one run.

    python -m benchmarks.rollup --dsn postgresql://postgres@127.0.0.1:5432/test --json out.json

Each run publishes ``n`` events into a scratch schema or file, then times one
burst drain by one worker (``eventbus.testing.drain_throughput``, no-op
handler, concurrency 200, batches of 100). "on" is the default bus, whose
worker counts each run in its rollup and appends the rollup when it stops;
"off" is ``Bus(rollup=False)``. The runs alternate off, on on each backend,
so drift of the machine falls on both alike; the report gives each mode's
median, range and runs, and the median's change. Beside them, the cost of
one ``Rollup.add`` (the only work the rollup adds per delivery), timed alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from typing import Any

import anyio

from eventbus.testing import drain_throughput
from eventbus.throughput import COMPLETED, Rollup


def _summary(rates: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(rates)), "min": round(min(rates)), "max": round(max(rates)),
        "runs": [round(r) for r in rates],
    }  # fmt: skip


async def backend(dsn: str | None, n: int, runs: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"off": [], "on": []}
    kind = ""
    for _ in range(runs):
        for mode in ("off", "on"):
            r = await drain_throughput(dsn, n, rollup=mode == "on")
            rates[mode].append(r.deliveries_per_second)
            kind = r.backend
    off, on = _summary(rates["off"]), _summary(rates["on"])
    change = round(100 * (on["median"] - off["median"]) / off["median"], 1)
    result = {"backend": kind, "n": n, "unit": "deliveries/s", "off": off, "on": on}
    result["median_change_pct"] = change
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


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results = [await backend(None, args.n, args.runs)]  # a temporary SQLite file
    results.append(await backend(args.dsn, args.n, args.runs))
    add = round(add_cost_ns())
    print(json.dumps({"rollup_add_ns": add}))
    return {"drain": results, "rollup_add_ns": add}


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
