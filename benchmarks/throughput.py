"""eventbus drain throughput across settings, and fan-out.

    python -m benchmarks.throughput --dsn postgresql://postgres@127.0.0.1:5432/test --json out.json
    python -m benchmarks.throughput --dsn sqlite:///bench.db

Scenarios: end-to-end drain (no-op and 1 ms handlers, several concurrency and
batch settings, median of 3), ordered drain (an ``ordered=True`` subscription,
1,000 ordering keys x 20 events each, FIFO per key) beside the same drain
unordered, and fan-out (1, 3 and 10 subscriptions on one type, deliveries/s).
Each run uses a scratch schema or file. Publish rates and
wake-up latency are measured with the peers, by ``benchmarks.peers.eventbus_bench``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import anyio

from eventbus.testing import drain_throughput


def _summary(rates: list[float]) -> dict[str, Any]:
    return {"runs": rates, "median": statistics.median(rates), "min": min(rates), "max": max(rates)}


async def drain(
    dsn: str, n: int, runs: int, settings: list[tuple[int, int, float, int]], ordering_keys: int = 0
) -> list[dict[str, Any]]:
    out = []
    for concurrency, batch, sleep, subs in settings:
        rates = []
        for _ in range(runs):
            r = await drain_throughput(
                dsn,
                n,
                concurrency=concurrency,
                batch_size=batch,
                subscriptions=subs,
                handler_sleep_seconds=sleep,
                ordering_keys=ordering_keys,
            )
            rates.append(r.deliveries_per_second)
        out.append(
            {
                "scenario": ("ordered_" if ordering_keys else "") + ("drain_1ms" if sleep else "drain_noop"),
                "n": n,
                "concurrency": concurrency,
                "batch_size": batch,
                "subscriptions": subs,
                "ordering_keys": ordering_keys,
                "unit": "deliveries/s",
                **_summary(rates),
            }
        )
        print(out[-1])
    return out


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    settings = [(200, 100, 0.0, 1), (100, 100, 0.0, 1), (50, 50, 0.0, 1), (200, 100, 0.001, 1)]
    fanout = [(200, 100, 0.0, 1), (200, 100, 0.0, 3), (200, 100, 0.0, 10)]
    results = await drain(args.dsn, args.n, args.runs, settings)
    results += await drain(args.dsn, args.n // 2, args.runs, fanout)
    if args.ordered_keys:
        # Ordered beside unordered on the same load: keys x events per key.
        n, keyed = args.ordered_keys * args.events_per_key, [(200, 100, 0.0, 1), (200, 100, 0.001, 1)]
        results += await drain(args.dsn, n, args.runs, keyed, ordering_keys=args.ordered_keys)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ordered-keys", type=int, default=1000, help="0 skips the ordered drain")
    parser.add_argument("--events-per-key", type=int, default=20)
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    out = anyio.run(main, ns)
    for row in out:
        print(row)
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(out, f, indent=2)
