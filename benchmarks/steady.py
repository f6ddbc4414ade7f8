"""A steady run on PostgreSQL: publishing and draining together, clean and with the xmin horizon held.

    python -m benchmarks.steady --dsn postgresql://postgres@127.0.0.1:5432/test --seconds 300 \\
        --paths default,append-only --json benchmarks/results/append_only_steady.json

One subscription with a no-op handler on a fresh schema per run (the phases
and counters of ``benchmarks/storage.py``). For ``--seconds`` a producer
publishes batches of 200 events (one delivery each) while fewer than
``--ahead`` deliveries are published and not yet handled (or, with
``--rate``, that many per second), and one worker (``Worker(bus,
concurrency=200, batch_size=100)``, not in burst mode: its upkeep runs, the
append-only ring's rotation, closing and pruning included) drains them. Every
``--prune-every`` seconds the bus's retention runs as in ``storage.py``
(``bus.prune`` with a completed retention of zero), in a task of its own
beside the producer and the worker; ``retention_pass_seconds`` lists how long
each pass took (negative: the pass was still walking when the run ended, and
was stopped after its batch). The run is made clean and
while another connection holds a ``REPEATABLE READ`` snapshot from before the
first publish to the end, so nothing the run leaves dead can be vacuumed; with
``--paths default,append-only`` the clean runs of both paths come first, then
the held ones, alternating; ``--rounds`` repeats the whole sequence and
gives every round's held/clean ratio.

Per completed delivery: updates plus deletes on the schema's tables
(``n_tup_upd + n_tup_del`` of ``pg_stat_user_tables``) and on the delivery
tables alone (deliveries, ring_ready, ring_claims, delivery_log and their
partitions), and on the database's system catalogs (the catalog churn of
partitions made, truncated, analyzed and dropped: other sessions of the
database are counted too), the dead tuples left at the end (``n_dead_tup``), WAL bytes (the
``pg_current_wal_lsn()`` difference: whatever every other session of the
server wrote meanwhile is in it; reading minutes of WAL with pg_walinspect
takes longer than the run) and the schema's table plus index bytes at the end;
completed deliveries per second over the run and per 30 s; and CPU time per
completed delivery, of this process (the producer and the worker) and of the
server (every process of the PostgreSQL server the DSN names, read from
``/proc`` when that server runs on this machine: run it against a cluster of
its own, as other sessions' work is counted too). On a machine shared with
other work a rate moves with the load, while CPU time per delivery moves
much less: held against clean, the CPU per delivery says whether the held
horizon costs work, the rate only whether the run got the cores. The append-only
path's outcome log keeps today's day (a day is dropped whole after it ends, by
DROP TABLE, which leaves no dead tuple).

Afterwards the worker is stopped, the rest is drained by a burst worker, and
the run checks that every published event's handler ran exactly once
(``lost``, ``duplicates``); ``event_loop_errors`` counts what the event loop
reported meanwhile (printed with its stack on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
import uuid
from datetime import timedelta
from typing import Any

import anyio
import asyncpg

from benchmarks.cpu import CpuMeter
from benchmarks.storage import PATHS, _bus, counters, held_horizon
from eventbus import Envelope, Retention, Worker
from eventbus.testing import BenchEvent, drain

BATCH = 200


class _Stopped(Exception):
    """The run ended during a retention pass."""


class Seen:
    """How many times the handler ran for each event (by its number)."""

    def __init__(self) -> None:
        self.runs = bytearray(1 << 20)
        self.count = self.duplicates = 0

    def hit(self, n: int) -> None:
        while n >= len(self.runs):
            self.runs.extend(bytearray(len(self.runs)))
        if self.runs[n]:
            self.duplicates += 1
        self.runs[n] = min(255, self.runs[n] + 1)
        self.count += 1

    def missing(self, published: int) -> int:
        return sum(1 for n in range(published) if n >= len(self.runs) or not self.runs[n])


async def run(
    dsn: str, seconds: float, hold: bool, append_only: bool, ahead: int, rate: float, prune_every: float
) -> dict[str, Any]:
    """One steady run on a fresh schema."""
    schema = f"eventbus_steady_{uuid.uuid4().hex[:10]}"
    seen = Seen()
    published = 0
    timeline: list[int] = []
    try:
        async with _bus(dsn, schema, migrate=True, append_only=append_only) as bus:
            await bus.register()
        async with held_horizon(dsn, hold, seconds + 600) as held:
            before = await counters(dsn, schema)
            async with _bus(dsn, schema, append_only=append_only, handled=seen.hit) as bus:
                worker = Worker(bus, concurrency=200, batch_size=100)
                passes: list[float] = []
                stopping = anyio.Event()

                def stop_walk(report: Any) -> None:
                    # A retention walk shields each batch and has no other checkpoint, so
                    # cancelling it waits for the end of the walk: stop it between batches.
                    if stopping.is_set():
                        raise _Stopped

                async def retention() -> None:
                    while prune_every:
                        with anyio.move_on_after(prune_every):
                            await stopping.wait()
                        if stopping.is_set():
                            return
                        started = time.perf_counter()
                        try:
                            await bus.prune(
                                retention=Retention(
                                    completed_retention=timedelta(0), dedup_window=timedelta(0)
                                ),
                                progress=stop_walk,
                            )
                        except _Stopped:
                            passes.append(-round(time.perf_counter() - started, 1))
                            return
                        passes.append(round(time.perf_counter() - started, 1))

                cpu = await CpuMeter.of(dsn)
                cpu.start()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(worker.run)
                    tg.start_soon(retention)
                    t0 = mark = time.perf_counter()
                    mark_count = 0
                    while (now := time.perf_counter()) - t0 < seconds:
                        if now - mark >= 30:
                            timeline.append(round((seen.count - mark_count) / (now - mark)))
                            mark, mark_count = now, seen.count
                        if (rate and published >= rate * (now - t0)) or published - seen.count >= ahead:
                            await anyio.sleep(0.005)
                            continue
                        await bus.publish_many(Envelope(BenchEvent(n=published + i)) for i in range(BATCH))
                        published += BATCH
                    elapsed = time.perf_counter() - t0
                    completed = seen.count
                    cpu.stop()
                    worker.stop()
                    stopping.set()  # a retention pass in flight stops after its batch
            after = await counters(dsn, schema)
            completed_after_stop = seen.count
        async with _bus(dsn, schema, append_only=append_only, handled=seen.hit) as bus:
            await drain(bus, wait_for_scheduled=False, concurrency=200, batch_size=100)
            report = await bus.status()
            left = sum(r.count for r in report.rows if r.status != "completed")
    finally:
        async with _bus(dsn, schema) as bus:
            await bus.backend.schema.drop()
    total_done = completed_after_stop
    wal = await _lsn_diff(dsn, before["lsn"], after["lsn"])
    out = {
        "path": "append-only" if append_only else "default",
        "held_xmin": hold,
        **held,
        "seconds": round(elapsed, 1),
        "published": published,
        "completed": total_done,
        "completed_per_second": completed / elapsed,
        "completed_per_second_each_30s": timeline,
        "retention_pass_seconds": passes,
        "per_delivery": {
            "updates_deletes": (after["writes"] - before["writes"]) / total_done,
            "delivery_updates_deletes": (after["delivery_writes"] - before["delivery_writes"]) / total_done,
            "event_updates_deletes": (after["event_writes"] - before["event_writes"]) / total_done,
            "inserts": (after["inserts"] - before["inserts"]) / total_done,
            "catalog_updates_deletes": (after["catalog_writes"] - before["catalog_writes"]) / total_done,
            "n_dead_tup_at_end": after["dead"] / total_done,
            "wal_bytes_cluster": wal / total_done,
            "size_at_end_bytes": after["bytes"] / total_done,
            **cpu.per(completed),
        },
        "n_dead_tup_at_end": after["dead"],
        "size_at_end_bytes": after["bytes"],
        "checks": {
            "lost": seen.missing(published),
            "duplicates": seen.duplicates,
            "left_after_final_drain": left,
        },
        "load1": os.getloadavg()[0],
    }
    print(json.dumps(out), flush=True)
    return out


async def _lsn_diff(dsn: str, before: str, after: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT $1::text::pg_lsn - $2::text::pg_lsn", after, before))
    finally:
        await conn.close()


LOOP_ERRORS: list[str] = []


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Keep what the event loop reports (asyncpg reports a pooled connection given back inside a
    transaction this way), with the stack that reported it."""
    LOOP_ERRORS.append(str(context.get("message")))
    print(
        f"event loop: {context.get('message')}",
        "".join(traceback.format_stack()),
        file=sys.stderr,
        flush=True,
    )
    loop.default_exception_handler(context)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    asyncio.get_running_loop().set_exception_handler(_loop_error)
    paths = args.paths.split(",")
    if unknown := set(paths) - set(PATHS):
        raise SystemExit(f"--paths: unknown {sorted(unknown)}; known: {', '.join(PATHS)}")
    rounds: list[dict[str, dict[str, Any]]] = []
    for _ in range(args.rounds):
        runs: dict[str, dict[str, Any]] = {p: {} for p in paths}
        for hold in (False, True):
            for path in paths:
                one = await run(
                    args.dsn, args.seconds, hold, PATHS[path], args.ahead, args.rate, args.prune_every
                )
                one["checks"]["event_loop_errors"] = len(LOOP_ERRORS)
                LOOP_ERRORS.clear()
                runs[path]["held_xmin" if hold else "clean"] = one
        for r in runs.values():
            held, clean = r["held_xmin"], r["clean"]
            r["held_over_clean"] = held["completed_per_second"] / clean["completed_per_second"]
            if clean["per_delivery"]["cpu_us"] is not None:
                r["held_over_clean_cpu_per_delivery"] = (
                    held["per_delivery"]["cpu_us"] / clean["per_delivery"]["cpu_us"]
                )
        rounds.append(runs)
    out: dict[str, Any] = {"benchmark": "steady", "backend": "postgres", "seconds": args.seconds}
    if args.rounds == 1:
        return {**out, "paths": rounds[0]}
    return {**out, "rounds": rounds}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=300.0, help="Length of each run.")
    parser.add_argument("--paths", default="default,append-only", help="default, append-only or both.")
    parser.add_argument(
        "--ahead", type=int, default=20_000, help="Most deliveries published and not yet handled."
    )
    parser.add_argument("--rate", type=float, default=0.0, help="Publish this many per second (0: keep up).")
    parser.add_argument("--prune-every", type=float, default=60.0, help="Seconds between retention passes.")
    parser.add_argument("--rounds", type=int, default=1, help="Repeat the clean and held runs.")
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    out = anyio.run(main, ns)
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(out, f, indent=2)
