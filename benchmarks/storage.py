"""What PostgreSQL storage costs per completed delivery: dead tuples, WAL, table and index growth.

    python -m benchmarks.storage --dsn postgresql://postgres@127.0.0.1:5432/test --n 100000 \\
        --json benchmarks/results/storage_postgres.json
    python -m benchmarks.storage --n 100000 --append-only          # the append-only hot path
    python -m benchmarks.storage --n 100000 --paths default,append-only \\
        --json benchmarks/results/append_only_storage.json     # both, alternating, one sitting

One subscription with a no-op handler on a fresh schema. Each run has three
phases, each with a bus of its own (closing a bus ends its connections, and a
PostgreSQL backend flushes its table statistics when it exits, so every
phase's counters are complete when the next one starts):

- ``publish``: ``--n`` events in batches of 1,000 (one delivery each);
- ``drain``: one burst worker (concurrency 200, batch 100) completes them;
- ``retention``: one pass of the bus's retention as it runs today
  (``bus.prune`` with a completed retention of zero: batched deletes of the
  completed deliveries; on PostgreSQL the chunk of the events is closed and
  dropped). On the append-only path (``--append-only``: every phase's bus is
  ``Bus(dsn, append_only=True)``) ``bus.prune`` drops only the outcome log's
  days that have ended, and today's cannot end inside a benchmark: the phase
  then drops today's day too, as the first pass after midnight (UTC) would, by
  calling the schema's ``delivery_log_drop(<tomorrow>, 30)``. Before
  ``bus.prune`` the retention phase of that path runs the ring's upkeep
  turns (``deliveries.upkeep()``) until the drained slot is truncated, as a
  running worker does within seconds of a drain, long before retention is
  due (``--no-ring-upkeep`` leaves it: retention then finds every event's
  ready row still in the ring and moves the events into ``events_kept``
  instead of dropping them with their chunk; ``events_kept_after_retention``
  counts them).

On the append-only path the drain finds a backlog that has sat in the ring
longer than the ring keeps rows (``MAX_AGE_SECONDS`` of ``ring.py``, counted
from the slot's opening, here at the schema's migration): the worker's first
upkeep turn spills it into ``deliveries`` and it is drained there, by today's
statements. ``in_deliveries_table`` counts the deliveries that left the ring;
``benchmarks/steady.py`` measures the ring with publishing and draining
together.

Per completed delivery and per phase: updates plus deletes on the bus's
tables (``n_tup_upd + n_tup_del`` of ``pg_stat_user_tables``, the tuples each
statement left dead), and of those on the event log's tables alone (events
and its chunks, event_keys, event_chunks, kept_keys: ``event_updates_deletes``;
a chunk dropped whole leaves none), and on the delivery tables alone
(deliveries, the ring's ring_ready and ring_claims with their slots, and the
outcome log delivery_log with its days: ``delivery_updates_deletes``), the
dead tuples not yet vacuumed (``n_dead_tup``), WAL bytes, and the growth of the tables with their indexes
(``pg_total_relation_size``). ``wal_bytes`` is the run's own WAL, read with
the ``pg_walinspect`` extension (created in the scratch schema, dropped with
it): the records of the transactions that wrote to the schema's relations,
commit records included, and the records on those relations written outside
a transaction (page pruning, vacuum); a temporary replication slot keeps the
WAL until it is read. ``wal_bytes_cluster`` is the ``pg_current_wal_lsn()``
difference, which counts what every other session of the server wrote
meanwhile. The drain rate is a timing, noisy on a loaded machine; the rest
are counts.

The run is made twice: clean, then with another connection holding a
``REPEATABLE READ`` snapshot open (the xmin horizon held back, so nothing
the run leaves dead can be vacuumed) for at most ``--hold-seconds``; the
ratio of the two drain rates is reported. The snapshot is taken once the
subscription is registered: a transaction older than a subscription keeps its
backfill owed until it ends, and on the append-only path no delivery of a
subscription with a backfill owed enters the ring (all of them would go to
``deliveries``). ``--paths default,append-only``
makes the clean runs of both paths, then the held runs, alternating, into
one file. Every run checks that each event's handler ran exactly once
(``handled``, ``duplicates``) and that nothing is left to run after the drain
(``left_after_drain``, from ``bus.status()``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import anyio
import asyncpg

from eventbus import Bus, Context, Envelope, Retention
from eventbus.testing import BenchEvent, drain

_COUNTERS = """
SELECT pg_current_wal_lsn()::text AS lsn,
       coalesce(sum(s.n_tup_ins), 0)::bigint AS inserts,
       coalesce(sum(s.n_tup_upd + s.n_tup_del), 0)::bigint AS writes,
       coalesce(sum(s.n_tup_upd + s.n_tup_del)
                FILTER (WHERE s.relname ~ '^(events|event_keys|event_chunks|kept_keys)'), 0)::bigint
           AS event_writes,
       coalesce(sum(s.n_tup_upd + s.n_tup_del)
                FILTER (WHERE s.relname ~ '^(deliveries|ring_ready|ring_claims|delivery_log)'), 0)::bigint
           AS delivery_writes,
       coalesce(sum(s.n_dead_tup), 0)::bigint AS dead,
       coalesce(sum(pg_total_relation_size(s.relid)), 0)::bigint AS bytes,
       (SELECT coalesce(sum(c.n_tup_upd + c.n_tup_del), 0)::bigint FROM pg_stat_sys_tables c
        WHERE c.schemaname = 'pg_catalog') AS catalog_writes
FROM pg_stat_user_tables s
WHERE s.schemaname = $1
"""

PHASES = ("publish", "drain", "retention")


async def counters(dsn: str, schema: str) -> dict[str, Any]:
    """The schema's table counters now, read from a fresh statistics snapshot."""
    await anyio.sleep(1.0)  # the closed bus's backends exit (and flush their statistics) meanwhile
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await conn.fetchrow(_COUNTERS, schema)
        assert row is not None  # an aggregate returns one row
        return dict(row)
    finally:
        await conn.close()


_OURS = """
SELECT array_agg(pg_relation_filenode(c.oid)) FROM pg_class c
WHERE c.relnamespace = $1::regnamespace
   OR c.oid IN (SELECT reltoastrelid FROM pg_class WHERE relnamespace = $1::regnamespace)
   OR c.oid IN (SELECT i.indexrelid FROM pg_index i JOIN pg_class t ON t.reltoastrelid = i.indrelid
                WHERE t.relnamespace = $1::regnamespace)
"""

# The WAL records of the transactions that wrote to the schema's relations (their
# commit records included), plus records on those relations without a transaction
# (page pruning, vacuum): the run's own WAL, whatever other sessions wrote meanwhile.
_ATTRIBUTED = """
WITH r AS (
    SELECT xid, record_length,
           EXISTS (SELECT 1 FROM regexp_matches(coalesce(block_ref, ''), 'rel \\d+/(\\d+)/(\\d+)', 'g') m
                   WHERE m[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND m[2]::oid = ANY($3::oid[])) AS touches
    FROM {schema}.pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
), ours AS (SELECT DISTINCT xid FROM r WHERE touches AND xid <> 0)
SELECT coalesce(sum(record_length), 0)::bigint FROM r
WHERE touches OR xid IN (SELECT xid FROM ours)
"""


async def wal_between(dsn: str, schema: str, before: str, after: str) -> tuple[int, int | None]:
    """WAL bytes from ``before`` to ``after``: all of it, and the run's own (None without pg_walinspect)."""
    conn = await asyncpg.connect(dsn)
    try:
        total = int(await conn.fetchval("SELECT $1::text::pg_lsn - $2::text::pg_lsn", after, before))
        try:
            await conn.execute(f'CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA "{schema}"')
        except asyncpg.PostgresError:
            return total, None
        nodes = await conn.fetchval(_OURS, schema)
        own = await conn.fetchval(_ATTRIBUTED.format(schema=f'"{schema}"'), before, after, nodes)
        return total, int(own)
    finally:
        await conn.close()


class Handled:
    """Which events the handler ran, and how many ran more than once."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.duplicates = 0

    def hit(self, n: int) -> None:
        if n in self.seen:
            self.duplicates += 1
        self.seen.add(n)


def _bus(
    dsn: str,
    schema: str,
    *,
    migrate: bool = False,
    append_only: bool = False,
    handled: Callable[[int], None] | None = None,
) -> Bus:
    """A bus on ``schema`` with the benchmark's subscription; ``handled`` is told each event's number."""
    bus = Bus(dsn, schema=schema, max_pool_size=8, migrate=migrate, append_only=append_only)

    @bus.subscribe(BenchEvent, name="bench.storage")
    async def handle(event: BenchEvent, ctx: Context) -> None:
        if handled is not None:
            handled(event.n)

    return bus


async def _publish(bus: Bus, n: int) -> None:
    await bus.register()  # the subscription exists before publishing: no backfill
    for start in range(0, n, 1000):
        await bus.publish_many(Envelope(BenchEvent(n=i)) for i in range(start, min(n, start + 1000)))
    await bus.backend.schema.analyze()


async def _drain(bus: Bus) -> float:
    """Drain everything with one burst worker; its deliveries per second."""
    started = time.perf_counter()
    done = await drain(bus, wait_for_scheduled=False, concurrency=200, batch_size=100)
    return done.processed / (time.perf_counter() - started)


async def _retention(bus: Bus, dsn: str, schema: str, append_only: bool, upkeep_first: bool) -> None:
    if append_only and upkeep_first:
        # What a running worker's upkeep does within seconds of the drain, long before
        # retention: the drained slot is rotated out, closed and truncated.
        for _ in range(100):
            await bus.backend.deliveries.upkeep()
            if not await _count(dsn, schema, "ring_ready"):
                break
            await anyio.sleep(0.2)
    await bus.prune(retention=Retention(completed_retention=timedelta(0), dedup_window=timedelta(0)))
    if append_only:
        # Today's day of the outcome log, dropped as the first pass after it ends would.
        conn = await asyncpg.connect(dsn)
        try:
            await conn.fetchval(
                f"SELECT \"{schema}\".delivery_log_drop((now() AT TIME ZONE 'UTC')::date + 1, 30)"
            )
        finally:
            await conn.close()


async def _count(dsn: str, schema: str, table: str) -> int:
    """Rows in one of the schema's tables (on the append-only path: the deliveries that left the ring)."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f'SELECT count(*) FROM "{schema}".{table}'))
    finally:
        await conn.close()


async def _left(bus: Bus) -> int:
    """Deliveries not completed, by the bus's own status."""
    report = await bus.status()
    return sum(r.count for r in report.rows if r.status != "completed")


@contextlib.asynccontextmanager
async def held_horizon(dsn: str, hold: bool, seconds: float) -> AsyncIterator[dict[str, float]]:
    """With ``hold``, a connection keeps a REPEATABLE READ snapshot open for at most ``seconds``."""
    held = {"held_seconds": 0.0}
    if not hold:
        yield held
        return
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await conn.fetchval("SELECT 1")  # the snapshot is taken (and xmin held) from here

        started = time.monotonic()

        async def release_later() -> None:
            await anyio.sleep(seconds)
            await conn.execute("ROLLBACK")
            held["released_early"] = 1.0

        async with anyio.create_task_group() as tg:
            tg.start_soon(release_later)
            yield held
            held["held_seconds"] = min(seconds, time.monotonic() - started)
            tg.cancel_scope.cancel()
    finally:
        await conn.close()


async def _phase(
    bus: Bus,
    phase: str,
    n: int,
    dsn: str,
    schema: str,
    append_only: bool,
    checks: dict[str, int],
    upkeep_first: bool = True,
) -> float:
    """Run one phase on ``bus``; the drain's deliveries per second (0 for the others)."""
    if phase == "publish":
        await _publish(bus, n)
    elif phase == "drain":
        rate = await _drain(bus)
        checks["left_after_drain"] = await _left(bus)
        checks["in_deliveries_table"] = await _count(dsn, schema, "deliveries")
        return rate
    else:
        await _retention(bus, dsn, schema, append_only, upkeep_first)
        if append_only:
            checks["events_kept_after_retention"] = await _count(dsn, schema, "events_kept")
    return 0.0


@contextlib.asynccontextmanager
async def wal_kept(dsn: str, name: str) -> AsyncIterator[None]:
    """Keep the WAL written from now on until the block ends (a temporary replication slot),
    so a checkpoint cannot remove what is still to be read."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_create_physical_replication_slot($1, true, true)", name)
        yield
    finally:
        await conn.close()  # a temporary slot goes with its session


async def run(
    dsn: str, n: int, hold: bool, hold_seconds: float, append_only: bool = False, upkeep_first: bool = True
) -> dict[str, Any]:
    """One run (publish, drain, retention) on a fresh schema; per-delivery figures per phase."""
    schema = f"eventbus_storage_{uuid.uuid4().hex[:10]}"
    phases: dict[str, dict[str, Any]] = {}
    rate = 0.0
    handled = Handled()
    checks: dict[str, int] = {}
    try:
        async with _bus(dsn, schema, migrate=True, append_only=append_only) as bus:
            await bus.register()  # before the snapshot is taken: see the docstring
        async with wal_kept(dsn, schema), held_horizon(dsn, hold, hold_seconds) as held:
            before = await counters(dsn, schema)
            for phase in PHASES:
                async with _bus(dsn, schema, append_only=append_only, handled=handled.hit) as bus:
                    rate = await _phase(bus, phase, n, dsn, schema, append_only, checks, upkeep_first) or rate
                after = await counters(dsn, schema)
                phases[phase] = await _per_delivery(dsn, schema, before, after, n)
                before = after
    finally:
        async with _bus(dsn, schema) as bus:
            await bus.backend.schema.drop()
    phases["total"] = {k: sum(p[k] for p in phases.values()) for k in phases["publish"] if k != "bytes_after"}
    phases["total"]["n_dead_tup_at_end"] = phases["retention"]["n_dead_tup_at_end"]
    checks.update(handled=len(handled.seen), duplicates=handled.duplicates)
    return {
        "path": "append-only" if append_only else "default",
        "held_xmin": hold,
        **held,
        "n": n,
        "drain_per_second": rate,
        "checks": checks,
        "per_delivery": phases,
    }


async def _per_delivery(
    dsn: str, schema: str, before: dict[str, Any], after: dict[str, Any], n: int
) -> dict[str, Any]:
    wal_all, wal_own = await wal_between(dsn, schema, before["lsn"], after["lsn"])
    return {
        "updates_deletes": (after["writes"] - before["writes"]) / n,
        "event_updates_deletes": (after["event_writes"] - before["event_writes"]) / n,
        "delivery_updates_deletes": (after["delivery_writes"] - before["delivery_writes"]) / n,
        "inserts": (after["inserts"] - before["inserts"]) / n,
        "wal_bytes": (wal_all if wal_own is None else wal_own) / n,
        "wal_bytes_cluster": wal_all / n,
        "size_growth_bytes": (after["bytes"] - before["bytes"]) / n,
        "n_dead_tup_at_end": after["dead"],
        "bytes_after": after["bytes"],
    }


PATHS = {"default": False, "append-only": True}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    paths = args.paths.split(",") if args.paths else ["append-only" if args.append_only else "default"]
    if unknown := set(paths) - set(PATHS):
        raise SystemExit(f"--paths: unknown {sorted(unknown)}; known: {', '.join(PATHS)}")
    runs: dict[str, dict[str, Any]] = {p: {} for p in paths}
    for hold in (False, True):
        for path in paths:
            one = await run(args.dsn, args.n, hold, args.hold_seconds, PATHS[path], not args.no_ring_upkeep)
            one["load1"] = os.getloadavg()[0]
            print(json.dumps(one, indent=1), flush=True)
            runs[path]["held_xmin" if hold else "clean"] = one
    for r in runs.values():
        r["held_over_clean_drain"] = r["held_xmin"]["drain_per_second"] / r["clean"]["drain_per_second"]
    out = {
        "benchmark": "storage",
        "backend": "postgres",
        "load1": os.getloadavg()[0],
        "reference": {"awa_published_dead_tuples_per_job": 0.007},
    }
    if len(paths) == 1:
        return {**out, "path": paths[0], **runs[paths[0]]}
    return {**out, "paths": runs}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=100_000, help="Deliveries per run.")
    parser.add_argument(
        "--hold-seconds", type=float, default=300.0, help="Longest the snapshot is held in the held run."
    )
    parser.add_argument(
        "--append-only", action="store_true", help="Open every phase's bus with append_only=True."
    )
    parser.add_argument(
        "--paths", default="", help="Paths to run side by side, alternating: default,append-only."
    )
    parser.add_argument(
        "--no-ring-upkeep",
        action="store_true",
        help="Append-only path: run retention straight after the drain, the drained slot not yet truncated.",
    )
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    out = anyio.run(main, ns)
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(out, f, indent=2)
