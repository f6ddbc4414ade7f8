"""Claim latency on PostgreSQL under steady load, with and without retention running beside it.

    python -m benchmarks.claim_latency --dsn postgresql://postgres@127.0.0.1:5432/bench_claimlat \\
        --seconds 60 --window 15 --json benchmarks/results/claim_latency.json

For each path (``--paths default,append-only``), on a freshly recreated
database (its name must start with ``bench_``): one subscription with a no-op
handler, a producer publishing batches of 200 events while fewer than
``--ahead`` deliveries are published and not yet handled, and one worker
(``Worker(bus, concurrency=200, batch_size=100)``, not in burst mode: its
upkeep runs, the append-only ring's rotation, closing and slot TRUNCATEs
included; the worker's own retention is off). The run alternates windows of
``--window`` seconds without retention and with it, until each phase has had
``--seconds``: in a window with retention, a task runs ``bus.prune`` with a
completed retention of zero in a loop (event chunks close and are dropped
every pass); on the append-only path each pass is preceded by the creation of
yesterday's day of the outcome log (``delivery_log_make``), which the pass's
``delivery_log_drop`` then drops under load, a DROP on the parent
``delivery_log`` as when a real day ends. With ``--walk-batches N`` a pass
is a worker's periodic one instead of ``bus.prune``'s walk to the end of the
log (under a steady producer that walk may not end in a window, and the
chunk drops come after it): one ``Pruner`` walks at most N batches per pass
from where its last pass stopped, then drops chunks. At the end of a window with
retention the pass in flight is stopped between batches, and the claims made
until it returned (the switch) count in neither phase.

Measured: the duration of each call of the store's ``claim`` (the worker's
``bus.backend.deliveries.claim``, wrapped on the instance: the pool's
connection wait and every statement of the claim), as p50/p95/p99/max per
phase, and p99(with)/p99(without). A side connection samples ``pg_locks`` of
the database every ``--sample-ms`` ms: every lock wait seen (``waitstart``),
its statement and the statement of the session blocking it; reported per
phase, the longest wait of a claim statement and of any statement, with the
blocker. A wait shorter than the sampling period may be missed; a wait's
length is known to within one period. Also per phase: slots pruned (each a
TRUNCATE of two partitions) and prunes that gave up on their lock timeout
(``RingStats``), retention passes, event chunks dropped and compacted,
outcome-log days dropped, completed deliveries per second, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import anyio
import asyncpg

from benchmarks.peers.common import recreate_database
from benchmarks.storage import PATHS, _bus
from eventbus import Envelope, Retention, Worker
from eventbus.retention import Pruner
from eventbus.testing import BenchEvent

SCHEMA = "eventbus"
BATCH = 200
RETENTION = Retention(completed_retention=timedelta(0), dedup_window=timedelta(0))

_WAITS = """
SELECT l.pid, l.locktype, l.mode, l.relation::regclass::text AS rel,
       extract(epoch FROM now() - l.waitstart)::float8 AS waited,
       l.waitstart, a.query,
       (SELECT string_agg(b.query, ' || ') FROM pg_stat_activity b
        WHERE b.pid = ANY(pg_blocking_pids(l.pid))) AS blocker
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = current_database() AND l.waitstart IS NOT NULL
"""


_CLAIMS = (
    "-- Lock up to $2 runnable rows with SKIP LOCKED",  # claim
    "-- As claim, ",  # claim_after, claim_ordered
    "-- Lock up to $4 ready rows of subscription $2",  # ring_claim
    "-- The claim from deliveries beside the ring",  # ring_claim_queue
)
_COMPLETIONS = (
    "-- One statement per lease token (a claim batch)",  # complete
    "-- The completion of ring claims",  # ring_complete
)


def _kind(query: str) -> str:
    """Which statement waits, by the opening of its text (``pg_stat_activity`` keeps only the
    first ``track_activity_query_size`` bytes, comments included)."""
    if query.startswith(_CLAIMS):
        return "claim"
    if query.startswith(_COMPLETIONS):
        return "completion"
    return "other"


def _short(query: str | None) -> str:
    return " ".join((query or "").split())[:160]


class Phases:
    """The current phase (``without``, ``with`` or ``switch``) and what each one saw."""

    def __init__(self) -> None:
        self.now = "switch"
        self.claims: dict[str, list[float]] = {"without": [], "with": []}
        self.waits: dict[str, dict[tuple[int, str], dict[str, Any]]] = {"without": {}, "with": {}}
        self.seconds = {"without": 0.0, "with": 0.0}
        self.completed = {"without": 0, "with": 0}
        self.ring = {"without": {}, "with": {}}  # type: dict[str, dict[str, int]]
        self.passes: dict[str, list[float]] = {"without": [], "with": []}
        self.events_dropped = {"without": 0, "with": 0}
        self.chunks_dropped = {"without": 0, "with": 0}
        self.chunks_compacted = {"without": 0, "with": 0}
        self.days_dropped = {"without": 0, "with": 0}
        self.load1: list[float] = []


def _pct(xs: list[float], p: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, round(p / 100 * (len(ys) - 1)))]


async def sample_locks(dsn: str, phases: Phases, period: float, stop: asyncio.Event) -> None:
    """Every lock wait seen in the database, keyed by (pid, waitstart), its longest length kept."""
    conn = await asyncpg.connect(dsn)
    try:
        while not stop.is_set():
            phase = phases.now
            for r in await conn.fetch(_WAITS):
                if phase == "switch":
                    continue
                key = (r["pid"], str(r["waitstart"]))
                seen = phases.waits[phase].get(key)
                if seen is None or r["waited"] > seen["waited"]:
                    phases.waits[phase][key] = {
                        "waited": r["waited"],
                        "kind": _kind(r["query"] or ""),
                        "lock": f"{r['locktype']} {r['mode']} {r['rel'] or ''}".strip(),
                        "query": _short(r["query"]),
                        "blocker": _short(r["blocker"]),
                    }
            await anyio.sleep(period)
    finally:
        await conn.close()


class _Stopped(Exception):
    """A retention pass cut short between batches."""


class Case:
    """One path on a fresh database: the producer, the worker, retention in its windows."""

    def __init__(self, dsn: str, append_only: bool, args: argparse.Namespace) -> None:
        self.dsn, self.append_only, self.args = dsn, append_only, args
        self.phases = Phases()
        self.handled = 0
        self.stop = asyncio.Event()
        self.retaining = asyncio.Event()  # a new pass may start
        self.cut = False  # the pass in flight stops after its batch
        self.pass_done = asyncio.Event()
        self.pass_done.set()
        self.pruner: Pruner | None = None

    def hit(self, n: int) -> None:
        self.handled += 1

    async def run(self) -> dict[str, Any]:
        await recreate_database(self.dsn)
        async with _bus(self.dsn, SCHEMA, migrate=True, append_only=self.append_only) as bus:
            await bus.register()
        async with _bus(self.dsn, SCHEMA, append_only=self.append_only, handled=self.hit) as bus:
            bus.retention = Retention(interval=None)  # retention runs only in its windows, from here
            if self.args.walk_batches:
                self.pruner = Pruner(bus.backend.retention, RETENTION)
            self._time_claims(bus.backend.deliveries)
            worker = Worker(bus, concurrency=200, batch_size=100)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                tg.start_soon(self._producer, bus)
                tg.start_soon(self._retention, bus)
                tg.start_soon(sample_locks, self.dsn, self.phases, self.args.sample_ms / 1000, self.stop)
                await anyio.sleep(self.args.warmup)
                await self._windows(getattr(bus.backend.deliveries, "ring", None))
                self.stop.set()
                self.retaining.set()
                worker.stop()
        return _report(self.append_only, self.phases)

    def _time_claims(self, store: Any) -> None:
        """Wrap the store's claim on this instance: each call's duration, in the phase it began
        and ended in."""
        claim, phases = store.claim, self.phases

        async def timed_claim(*a: Any, **kw: Any) -> Any:
            phase = phases.now
            t0 = time.perf_counter()
            out = await claim(*a, **kw)
            if phase == phases.now and phase != "switch":
                phases.claims[phase].append((time.perf_counter() - t0) * 1000)
            return out

        store.claim = timed_claim

    async def _windows(self, ring: Any) -> None:
        """Alternate the phases, ``--window`` seconds each, until each had ``--seconds``. A window
        with retention lasts until its pass in flight ends (at most ``--window`` more seconds;
        then the pass is cut after its batch and the claims until it returns count nowhere)."""
        phases, args = self.phases, self.args
        order = ["without", "with"]
        while min(phases.seconds.values()) < args.seconds:
            for phase in order:
                if phases.seconds[phase] >= args.seconds:
                    continue
                span = min(args.window, args.seconds - phases.seconds[phase])
                ring_before = asdict(ring.stats) if ring is not None else {}
                done_before = self.handled
                phases.now = phase
                if phase == "with":
                    self.cut = False
                    self.retaining.set()
                t0 = time.perf_counter()
                await anyio.sleep(span)
                self.retaining.clear()
                with anyio.move_on_after(args.window):
                    await self.pass_done.wait()
                phases.seconds[phase] += time.perf_counter() - t0
                phases.completed[phase] += self.handled - done_before
                if ring is not None:
                    for k, v in asdict(ring.stats).items():
                        phases.ring[phase][k] = phases.ring[phase].get(k, 0) + v - ring_before[k]
                phases.now = "switch"
                self.cut = True
                await self.pass_done.wait()
                phases.load1.append(os.getloadavg()[0])
            order.reverse()  # without, with, with, without, ...: each phase leads as often

    async def _producer(self, bus: Any) -> None:
        published = 0
        while not self.stop.is_set():
            if published - self.handled >= self.args.ahead:
                await anyio.sleep(0.005)
                continue
            await bus.publish_many(Envelope(BenchEvent(n=published + i)) for i in range(BATCH))
            published += BATCH

    def _stop_walk(self, report: Any) -> None:
        if self.cut:
            raise _Stopped

    async def _retention(self, bus: Any) -> None:
        side = await asyncpg.connect(self.dsn)
        try:
            await side.execute("SET lock_timeout = '200ms'")
            while True:
                await self.retaining.wait()
                if self.stop.is_set():
                    return
                self.pass_done.clear()
                try:
                    await self._one_pass(bus, side)
                finally:
                    self.pass_done.set()
                await anyio.sleep(0.2)
        finally:
            await side.close()

    async def _one_pass(self, bus: Any, side: Any) -> None:
        """One ``bus.prune``; on the append-only path with yesterday's outcome log made first."""
        phases = self.phases
        days = 0
        if self.append_only:
            try:
                await side.fetchval(
                    f"SELECT {SCHEMA}.delivery_log_make((now() AT TIME ZONE 'UTC')::date - 1)"
                )
            except asyncpg.exceptions.LockNotAvailableError:
                pass  # the benchmark's own CREATE waited 200 ms: this pass drops no day
            days = await _day_count(side)
        t0 = time.perf_counter()
        try:
            if self.pruner is None:
                report = await bus.prune(retention=RETENTION, progress=self._stop_walk)
            else:
                report = await self.pruner.run(max_batches=self.args.walk_batches, progress=self._stop_walk)
        except _Stopped:
            phases.passes["with"].append(-round(time.perf_counter() - t0, 2))
        else:
            phases.passes["with"].append(round(time.perf_counter() - t0, 2))
            phases.chunks_dropped["with"] += report.event_chunks
            phases.chunks_compacted["with"] += report.event_chunks_compacted
            phases.events_dropped["with"] += report.events
        if self.append_only:
            phases.days_dropped["with"] += days - await _day_count(side)


async def _day_count(conn: Any) -> int:
    """The outcome log's days (partitions of ``delivery_log``)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass", f"{SCHEMA}.delivery_log"
        )
    )


def _report(append_only: bool, phases: Phases) -> dict[str, Any]:
    out: dict[str, Any] = {"path": "append-only" if append_only else "default"}
    for phase in ("without", "with"):
        xs = phases.claims[phase]
        waits = list(phases.waits[phase].values())
        claim_waits = [w for w in waits if w["kind"] == "claim"]
        longest = max(waits, key=lambda w: w["waited"], default=None)
        longest_claim = max(claim_waits, key=lambda w: w["waited"], default=None)
        out[phase] = {
            "seconds": round(phases.seconds[phase], 1),
            "claims": len(xs),
            "claim_ms_p50": round(statistics.median(xs), 3),
            "claim_ms_p95": round(_pct(xs, 95), 3),
            "claim_ms_p99": round(_pct(xs, 99), 3),
            "claim_ms_max": round(max(xs), 3),
            "completed_per_second": round(phases.completed[phase] / phases.seconds[phase]),
            "lock_waits_seen": len(waits),
            "claim_lock_waits_seen": len(claim_waits),
            "longest_claim_lock_wait_ms": round(longest_claim["waited"] * 1000, 1) if longest_claim else 0.0,
            "longest_claim_lock_wait": longest_claim,
            "longest_lock_wait_ms": round(longest["waited"] * 1000, 1) if longest else 0.0,
            "longest_lock_wait": longest,
            "ring": phases.ring[phase],
            "retention_passes": len([p for p in phases.passes[phase] if p >= 0]),
            "retention_passes_cut": len([p for p in phases.passes[phase] if p < 0]),
            "retention_pass_seconds": phases.passes[phase],
            "event_chunks_dropped": phases.chunks_dropped[phase],
            "event_chunks_compacted": phases.chunks_compacted[phase],
            "events_pruned": phases.events_dropped[phase],
            "outcome_log_days_dropped": phases.days_dropped[phase],
        }
    out["p99_with_over_without"] = round(out["with"]["claim_ms_p99"] / out["without"]["claim_ms_p99"], 2)
    out["load1_each_window"] = phases.load1
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    paths = args.paths.split(",")
    if unknown := set(paths) - set(PATHS):
        raise SystemExit(f"--paths: unknown {sorted(unknown)}; known: {', '.join(PATHS)}")
    out: dict[str, Any] = {
        "benchmark": "claim_latency",
        "seconds_each_phase": args.seconds,
        "window": args.window,
        "paths": {},
    }
    for path in paths:
        one = await Case(args.dsn, PATHS[path], args).run()
        print(json.dumps(one, indent=1), flush=True)
        out["paths"][path] = one
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/bench_claimlat")
    parser.add_argument("--paths", default="default,append-only", help="default, append-only or both.")
    parser.add_argument("--seconds", type=float, default=60.0, help="Measured seconds of each phase.")
    parser.add_argument("--window", type=float, default=15.0, help="Seconds of one window of a phase.")
    parser.add_argument("--warmup", type=float, default=5.0, help="Seconds before the first window.")
    parser.add_argument(
        "--ahead", type=int, default=20_000, help="Most deliveries published and not yet handled."
    )
    parser.add_argument(
        "--walk-batches",
        type=int,
        default=0,
        help="0: each pass is bus.prune (its walk to the end of the log); N: a pass walks at most N "
        "batches from where the last one stopped, as a worker's periodic pass does.",
    )
    parser.add_argument("--sample-ms", type=float, default=10.0, help="Period of the pg_locks sampling.")
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(result, f, indent=2)
