"""Drain rates of eventbus (default and append-only paths) and PgQueuer, side by side in one process.

    python -m benchmarks.peers.drain_side_by_side --runs 3 --n 20000 \\
        --json benchmarks/results/drain_side_by_side_append_only.json

Each round drains once with every system, in an order rotated from round to
round, with the harness's ``drain_once`` (a database recreated for the run,
``--n`` jobs pre-enqueued in batches of 1,000, ``ANALYZE``, one worker timed
until the handler has finished job ``--n``), for the no-op handler and the
1 ms one. The table gives the median and the min-max over the rounds, and
each eventbus setting's ratio to PgQueuer's best setting run (see below),
median over median and round by round; and each run's CPU time per job
(``benchmarks/cpu.py``: this process's, which holds the worker, and the
server's when it runs on this machine: give ``--host`` a cluster of the
benchmark's own, or other sessions' work is counted in it). Benchmark and
server share the machine's cores, so with the cores busy the rate follows the
CPU time per job.

Systems: ``eventbus`` (``Worker(concurrency=200, batch_size=100)``),
``eventbus-append-only`` (the same on ``Bus(dsn, append_only=True)``),
``pgqueuer`` (``QueueManager.run(batch_size=100)``, its tuned setting in
``README.md``) and, with ``--systems``, ``pgqueuer-default`` (batch_size=10),
``pgqueuer-200`` and ``pgqueuer-500`` (larger batches), ``eventbus-wide`` and
``eventbus-append-only-wide`` (``Worker(concurrency=400, batch_size=200)``).
Each eventbus setting's ratio is to the best PgQueuer setting of the run (by
median; ``pgqueuer_best`` names it per scenario).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cpu import CpuMeter
from benchmarks.peers.eventbus_bench import EventbusAdapter
from benchmarks.peers.harness import Adapter, drain_once
from benchmarks.peers.pgqueuer_bench import PgQueuerAdapter

HOST = "postgresql://postgres@127.0.0.1:5432"


def systems(host: str) -> dict[str, Callable[[], Adapter]]:
    return {
        "eventbus": lambda: EventbusAdapter(f"{host}/bench_eventbus", 200, 100, False),
        "eventbus-append-only": lambda: EventbusAdapter(f"{host}/bench_eventbus_ao", 200, 100, True),
        "pgqueuer": lambda: PgQueuerAdapter(f"{host}/bench_pgqueuer", 100),
        "pgqueuer-default": lambda: PgQueuerAdapter(f"{host}/bench_pgqueuer", 10),
        "eventbus-wide": lambda: EventbusAdapter(f"{host}/bench_eventbus", 400, 200, False),
        "eventbus-append-only-wide": lambda: EventbusAdapter(f"{host}/bench_eventbus_ao", 400, 200, True),
        "pgqueuer-200": lambda: PgQueuerAdapter(f"{host}/bench_pgqueuer", 200),
        "pgqueuer-500": lambda: PgQueuerAdapter(f"{host}/bench_pgqueuer", 500),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    known = systems(args.host)
    names = args.systems.split(",")
    if unknown := set(names) - set(known):
        raise SystemExit(f"--systems: unknown {sorted(unknown)}; known: {', '.join(known)}")
    scenarios = {"drain_noop": 0.0, "drain_1ms": 0.001}
    rates: dict[str, dict[str, list[float]]] = {s: {name: [] for name in names} for s in scenarios}
    cpu_us: dict[str, dict[str, list[dict[str, float | None]]]] = {
        s: {name: [] for name in names} for s in scenarios
    }
    loads: list[float] = []
    for r in range(args.runs):
        order = names[r % len(names) :] + names[: r % len(names)]
        for scenario, sleep_s in scenarios.items():
            for name in order:
                print(f"round {r + 1} {scenario} {name}", flush=True)
                meter = await CpuMeter.of(f"{args.host}/postgres")
                rates[scenario][name].append(
                    await drain_once(known[name], args.n, sleep_s, args.timeout, meter)
                )
                cpu_us[scenario][name].append(meter.per(args.n))
                loads.append(os.getloadavg()[0])
    out: dict[str, Any] = {"n": args.n, "runs": args.runs, "load1": loads, "scenarios": {}}
    for scenario, by in rates.items():
        table: dict[str, dict[str, Any]] = {
            name: {
                "runs": [round(x) for x in v],
                "median": round(statistics.median(v)),
                "cpu_us_per_job": cpu_us[scenario][name],
            }
            for name, v in by.items()
        }
        peers = [name for name in names if name.startswith("pgqueuer")]
        if peers:
            best_name = max(peers, key=lambda name: statistics.median(by[name]))
            best = by[best_name]
            out.setdefault("pgqueuer_best", {})[scenario] = best_name
            for name in names:
                if name.startswith("eventbus"):
                    table[name]["over_pgqueuer_median"] = round(
                        statistics.median(by[name]) / statistics.median(best), 2
                    )
                    table[name]["over_pgqueuer_each_round"] = [
                        round(a / b, 2) for a, b in zip(by[name], best, strict=True)
                    ]
        out["scenarios"][scenario] = table
    print(json.dumps(out, indent=1), flush=True)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=HOST, help="server DSN without the database (bench_* are recreated)")
    p.add_argument("--systems", default="eventbus,eventbus-append-only,pgqueuer")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    result = asyncio.run(main(ns))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2))
