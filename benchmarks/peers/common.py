"""Tiny shared helpers for the peer benchmarks: timing, medians, DB reset, JSON output.

Result record (one JSON object per measurement)::

    {"system": "pgqueuer", "scenario": "drain_noop", "setting": "batch=10",
     "workers": 1, "n": 20000, "runs": [r1, r2, r3], "median": ..., "min": ..., "max": ...,
     "unit": "events/s", "p50": null, "p99": null}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

PAYLOAD_PAD = "x" * 64  # every peer gets the same ~80-byte JSON payload: {"i": n, "pad": ...}


def now() -> float:
    """Monotonic high-resolution clock in seconds (shared by producer and handler)."""
    return time.perf_counter()


def payload(i: int) -> dict[str, Any]:
    return {"i": i, "pad": PAYLOAD_PAD}


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def record(
    system: str,
    scenario: str,
    setting: str,
    runs: list[float],
    *,
    n: int,
    unit: str = "events/s",
    workers: int = 1,
    samples: list[float] | None = None,
    note: str = "",
) -> dict[str, Any]:
    """Build one result record; `samples` (latencies in ms) fill p50/p99."""
    rec: dict[str, Any] = {
        "system": system,
        "scenario": scenario,
        "setting": setting,
        "workers": workers,
        "n": n,
        "runs": [round(r, 2) for r in runs],
        "median": round(statistics.median(runs), 2) if runs else None,
        "min": round(min(runs), 2) if runs else None,
        "max": round(max(runs), 2) if runs else None,
        "unit": unit,
        "p50": round(percentile(samples, 50), 3) if samples else None,
        "p99": round(percentile(samples, 99), 3) if samples else None,
    }
    rec["load1"] = round(os.getloadavg()[0], 2)  # other work on the box skews figures
    if note:
        rec["note"] = note
    print(json.dumps(rec), flush=True)
    return rec


def write_results(path: str | None, records: list[dict[str, Any]]) -> None:
    if path:
        Path(path).write_text(json.dumps(records, indent=2) + "\n")


async def repeat(runs: int, one_run: Callable[[], Awaitable[float]]) -> list[float]:
    """Run `one_run` `runs` times (each on a fresh database) and collect its rates."""
    return [await one_run() for _ in range(runs)]


async def recreate_database(dsn: str) -> None:
    """DROP + CREATE the benchmark database named in `dsn` (must start with bench_)."""
    parts = urlsplit(dsn)
    name = parts.path.lstrip("/")
    if not name.startswith("bench_"):
        raise SystemExit(f"refusing to recreate non-benchmark database {name!r}")
    admin = urlunsplit(parts._replace(path="/postgres"))
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def analyze_database(dsn: str) -> None:
    """ANALYZE after a bulk pre-load, as autovacuum would in steady state.

    Without it a freshly loaded 20k backlog can get a sort-the-whole-queue plan
    (seen with procrastinate: ~50 jobs/s instead of hundreds)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


class Countdown:
    """Thread-safe handler counter; sets an asyncio.Event when `target` is reached."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.done_at: float | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def hit(self) -> None:
        with self._lock:
            self.count += 1
            reached = self.count == self.target
        if reached:
            self.done_at = now()
            self._loop.call_soon_threadsafe(self.event.set)

    async def wait(self, timeout: float) -> bool:
        """True if the target was reached before `timeout` seconds."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
            return True
        except TimeoutError:
            return False


def parse_args(description: str, default_db: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dsn", default=f"postgresql://postgres@127.0.0.1:5432/{default_db}")
    p.add_argument("--n", type=int, default=20_000, help="jobs per drain run / batch publish")
    p.add_argument("--single-n", type=int, default=2_000, help="single publishes per run")
    p.add_argument("--samples", type=int, default=200, help="idle wake-up samples")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=240.0, help="cap (s) for one drain run")
    p.add_argument("--only", default="", help="comma list: drain,publish,wakeup,cost")
    p.add_argument("--json", default=None, help="write the result records here")
    args = p.parse_args()
    args.parts = set(filter(None, args.only.split(","))) or {"drain", "publish", "wakeup", "cost"}
    return args


def env_note() -> str:
    return f"cpus={os.cpu_count()} load1={os.getloadavg()[0]:.2f}"
