"""Drain throughput of the embedded SQLite backend: one process or several on one file.

    python -m benchmarks.sqlite_throughput --n 20000 --processes 1|4 \\
        [--synchronous FULL|NORMAL] [--concurrency 100] [--batch-size 100] [--runs 3] [--json out.json]

Each run: a fresh file (``sqlite:///…?synchronous=…``), one no-op subscription
registered, N events published beforehand with ``publish_many`` in batches of
1,000 (not timed), then drained either by one in-process burst
:class:`~eventbus.Worker` (``--processes 1``) or by that many
``eventbus worker benchmarks.sqlite_throughput:bus --burst`` processes
started together. The figure is events/s end to end: N over the time from the
drain's start (before the processes are spawned) to the last completion (the
largest ``updated_at``, database clock) — so it includes process start-up,
which is also measured alone (the same processes on an empty queue) and
reported as ``startup_seconds``. Median of ``--runs`` runs.

This module is also the worker application (``bus``), built from ``$EVENTBUS_DSN``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from eventbus import Bus, Context, Envelope, Worker
from eventbus.testing import BenchEvent

ROOT = Path(__file__).resolve().parents[1]
EVENTBUS = str(Path(sys.executable).parent / "eventbus")
APP = "benchmarks.sqlite_throughput:bus"


def build_bus(dsn: str | None = None) -> Bus:
    b = Bus(dsn)

    @b.subscribe(BenchEvent, name="bench-noop")
    async def noop(event: BenchEvent, ctx: Context) -> None:
        pass

    return b


bus = build_bus()  # the worker processes' app (nothing is opened until used)


async def _prepare(dsn: str, n: int) -> None:
    b = build_bus(dsn)
    await b.migrate()
    async with b:
        await b.backend.deliveries.register(b.specs())  # subscribed before publishing: no backfill
        for start in range(0, n, 1000):
            await b.publish_many(Envelope(BenchEvent(n=i)) for i in range(start, min(n, start + 1000)))


async def _drain_in_process(dsn: str, concurrency: int, batch_size: int) -> None:
    async with build_bus(dsn) as b:
        await Worker(b, burst=True, concurrency=concurrency, batch_size=batch_size).run()


def _drain_processes(dsn: str, processes: int, concurrency: int, batch_size: int) -> None:
    env = dict(os.environ, EVENTBUS_DSN=dsn)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        EVENTBUS,
        "worker",
        APP,
        "--burst",
        "--concurrency",
        str(concurrency),
        "--batch-size",
        str(batch_size),
    ]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE) for _ in range(processes)]
    try:
        for p in procs:
            _out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"worker {p.pid} exited {p.returncode}: {err.decode()[-2000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _completed(path: str) -> tuple[int, float]:
    conn = sqlite3.connect(path)
    try:
        done, last = conn.execute(
            "SELECT count(*), max(updated_at) FROM deliveries WHERE status = 'completed'"
        ).fetchone()
    finally:
        conn.close()
    return int(done), float(last or 0.0)


def one_run(n: int, processes: int, synchronous: str, concurrency: int, batch_size: int) -> float:
    """Events/s of one drain, from its start to the last completion."""
    with tempfile.TemporaryDirectory(prefix="eventbus-sqlite-bench-") as tmp:
        path = os.path.join(tmp, "bench.db")
        dsn = f"sqlite:///{path}?synchronous={synchronous}"
        anyio.run(_prepare, dsn, n)
        started = time.time()  # the database clock (julianday('now')) is the system clock
        if processes == 1:
            anyio.run(_drain_in_process, dsn, concurrency, batch_size)
        else:
            _drain_processes(dsn, processes, concurrency, batch_size)
        done, last = _completed(path)
        if done != n:
            raise RuntimeError(f"only {done} of {n} deliveries completed")
        return n / (last - started)


def startup_seconds(processes: int, synchronous: str) -> float:
    """Wall time of the worker processes on an empty queue (import, open, register, exit)."""
    if processes == 1:
        return 0.0
    with tempfile.TemporaryDirectory(prefix="eventbus-sqlite-bench-") as tmp:
        dsn = f"sqlite:///{os.path.join(tmp, 'bench.db')}?synchronous={synchronous}"
        anyio.run(_prepare, dsn, 0)
        started = time.perf_counter()
        _drain_processes(dsn, processes, 1, 1)
        return time.perf_counter() - started


def main(args: argparse.Namespace) -> dict[str, Any]:
    rates = []
    for _ in range(args.runs):
        rates.append(one_run(args.n, args.processes, args.synchronous, args.concurrency, args.batch_size))
        print(f"  run: {rates[-1]:,.0f} events/s", file=sys.stderr)
    median = statistics.median(rates)
    startup = startup_seconds(args.processes, args.synchronous)
    return {
        "scenario": "sqlite_drain_noop",
        "n": args.n,
        "processes": args.processes,
        "synchronous": args.synchronous,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "unit": "events/s",
        "runs": rates,
        "median": median,
        "min": min(rates),
        "max": max(rates),
        "startup_seconds": startup,
        # An estimate: the median drain with the processes' start-up taken out.
        "median_excluding_startup": args.n / max(args.n / median - startup, 1e-9),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    result = main(ns)
    print(json.dumps(result))
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(result, f, indent=2)
