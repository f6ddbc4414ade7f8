"""A prototype of the append-only PostgreSQL hot path (OPS.md §1.4, stage S2), measured against today's.

    python -m benchmarks.append_only --dsn postgresql://postgres@127.0.0.1:5432/test \\
        --json benchmarks/results/append_only.json
    python -m benchmarks.append_only --deliveries 100000 --runs 1          # the issue's size

Everything runs in a scratch database created for the sitting (dropped at the
end), so catalog and WAL figures are the run's own. The prototype lives in a
throwaway schema of it:

- ``ready`` (``slot, delivery_id, run``) and ``claims`` (same key, the first
  fence) are ``LIST (slot)`` rings of ``--slots`` partitions; ``ring_log`` is
  an append-only ledger of slot generations (``open``, ``closing``,
  ``pruned``), never updated;
- ``log`` (``part, delivery_id, run``: the second fence) and ``events`` are
  ``LIST (part)`` partitioned by time buckets of ``--bucket-seconds`` (the
  stand-in for days), made ahead and dropped past ``keep_buckets`` once no
  ready row (events) or claim row (log) of the ring was made in them;
- publish inserts events and one ready row per subscription into the current
  slot; a claim anti-joins the claim ledger (``ORDER BY run_at, delivery_id
  LIMIT n FOR UPDATE SKIP LOCKED``) and inserts its claims ``ON CONFLICT DO
  NOTHING RETURNING``; completion, failure (a new ready row with ``run + 1``)
  and death are one log insert ``ON CONFLICT DO NOTHING`` (an empty result
  means the lease was lost); the leader rescues expired leases with a
  ``lease_expired`` (or ``dead``) log row under the claim's key;
- every ``--rotate-seconds`` the leader opens the next slot (when it has been
  pruned), ANALYZEs the one it sealed, closes the sealed slots whose rows are
  all claimed (the oldest anyway when the ring is about to be full; workers
  stop claiming from a closed slot within a tick) and prunes closed slots:
  ``SET LOCAL
  lock_timeout = '10ms'``, lock both partitions, give up while a lease is
  still valid, rescue expired ones, carry unclaimed rows forward into the
  current slot with the same ids, ``TRUNCATE`` both.

Claims name the parent with ``slot = ANY(window)`` and a custom plan
(``--claim-mode custom``, the default), the parent under PostgreSQL's own
plan choice (``generic``: asyncpg's prepared statements), or the leaf
partitions themselves, one statement per slot (``leaf``).

A sitting makes ``--runs`` clean runs and one held-xmin run (another connection
holds a ``REPEATABLE READ`` snapshot) of each layout: the prototype, and
today's tables driven by a real ``eventbus.Bus`` (the phases of
``benchmarks/storage.py``: publish, drain with one burst worker, retention).
Per completed delivery and phase: updates plus deletes on the schema's tables
(``n_tup_upd + n_tup_del``, TRUNCATE and DROP leave none), WAL bytes of the
scratch database (``pg_walinspect``: records on its relations, catalogs
included, and the records of the transactions that wrote them) and table plus
index growth; ``pg_class`` and all ``pg_catalog`` updates and deletes
(catalog churn from TRUNCATE, ANALYZE and partition DDL); claim latency
p50/p99, the prototype's split by whether a prune transaction overlapped the
claim. Every prototype run checks its correctness (see ``check``). Then a
race run (two subscriptions, failures, expiring leases whose late completions
must lose, fast rotation, published while draining), a steady run (published
at ``--steady-rate`` while draining, so prunes run under claims) and the
generic-plan probe (``plan_probe``: does a claim lock the closed slot, and
does a 10 ms TRUNCATE get through while claims run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import asyncpg

from benchmarks.storage import _bus, _drain, _phase, held_horizon, wal_kept

PHASES = ("publish", "drain", "retention")
TERMINAL = ("completed", "dead")


@dataclass
class Config:
    """One prototype run's shape."""

    events: int = 50_000
    subscriptions: int = 1
    workers: int = 8
    batch: int = 100
    slots: int = 8
    rotate_seconds: float = 1.0
    close_lag: int = 3  # a slot is closed this many rotations after it stopped being current
    tick_seconds: float = 0.1
    lease_seconds: float = 2.0
    fail: float = 0.01  # fraction of runs whose handler fails
    expire: float = 0.0  # fraction of runs whose worker lets the lease expire, then completes late
    max_attempts: int = 3
    backoff_seconds: float = 0.05
    bucket_seconds: float = 5.0
    keep_buckets: int = 3  # log and event buckets kept behind the current one
    claim_mode: str = "custom"  # custom | generic | leaf
    steady: bool = False  # publish while the workers drain (rotations and prunes under claim load)
    publish_rate: float = 0.0  # deliveries per second when steady (0: as fast as possible)
    analyze_on_rotate: bool = True  # ANALYZE the slot just sealed, so claims plan on its real size
    publish_batch: int = 1000
    seed: int = 1

    @property
    def deliveries(self) -> int:
        return self.events * self.subscriptions


_SETTLE_COLUMNS = ("part", "delivery_id", "run", "subscription_id", "event_part", "event_id", "attempt")


def _bucket(expr: str, cfg: Config) -> str:
    return f"(floor(extract(epoch FROM {expr}) / {cfg.bucket_seconds}))::int"


# -- the schema ---------------------------------------------------------------------------------

_DDL = """
CREATE SCHEMA {s};
CREATE SEQUENCE {s}.event_ids;
CREATE SEQUENCE {s}.delivery_ids;
CREATE TABLE {s}.ring_log (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    gen bigint NOT NULL, slot int NOT NULL, kind text NOT NULL, at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON {s}.ring_log (gen, kind);
CREATE TABLE {s}.events (
    part int NOT NULL, id bigint NOT NULL, payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (part, id)) PARTITION BY LIST (part);
CREATE TABLE {s}.ready (
    slot int NOT NULL, delivery_id bigint NOT NULL, run int NOT NULL, subscription_id int NOT NULL,
    event_part int NOT NULL, event_id bigint NOT NULL, run_at timestamptz NOT NULL, attempt int NOT NULL,
    PRIMARY KEY (slot, delivery_id, run)) PARTITION BY LIST (slot);
CREATE INDEX ON {s}.ready (subscription_id, run_at, delivery_id);
CREATE TABLE {s}.claims (
    slot int NOT NULL, delivery_id bigint NOT NULL, run int NOT NULL, lease_token bigint NOT NULL,
    lease_until timestamptz NOT NULL, worker_id int NOT NULL, claimed_at timestamptz NOT NULL,
    PRIMARY KEY (slot, delivery_id, run)) PARTITION BY LIST (slot);
CREATE INDEX ON {s}.claims (lease_until);
CREATE TABLE {s}.log (
    part int NOT NULL, delivery_id bigint NOT NULL, run int NOT NULL, subscription_id int NOT NULL,
    status text NOT NULL, worker_id int NOT NULL, finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (part, delivery_id, run)) PARTITION BY LIST (part);
CREATE INDEX ON {s}.log (subscription_id, finished_at);
CREATE TABLE {s}.dead_letters (
    delivery_id bigint NOT NULL, run int NOT NULL, subscription_id int NOT NULL, event_part int NOT NULL,
    event_id bigint NOT NULL, reason text NOT NULL, died_at timestamptz NOT NULL DEFAULT now());
"""


class Ring:
    """The prototype's statements on one schema."""

    def __init__(self, schema: str, cfg: Config) -> None:
        self.name = schema
        self.s = f'"{schema}"'
        self.cfg = cfg
        s = self.s

        def b(e: str) -> str:
            return _bucket(e, cfg)

        cur = f"(SELECT slot FROM {s}.ring_log WHERE kind = 'open' ORDER BY gen DESC LIMIT 1)"
        self.publish = f"""
WITH ev AS (
    INSERT INTO {s}.events (part, id, payload)
    SELECT {b("now()")}, nextval('{s}.event_ids'), p FROM unnest($1::bytea[]) AS p
    RETURNING part, id
)
INSERT INTO {s}.ready (slot, delivery_id, run, subscription_id, event_part, event_id, run_at, attempt)
SELECT {cur}, nextval('{s}.delivery_ids'), 1, sub, ev.part, ev.id, now(), 1
FROM ev CROSS JOIN unnest($2::int[]) AS sub
RETURNING delivery_id"""
        # One log insert settles a batch: completed, failed (a new ready row, run + 1, in the
        # current slot) or dead (a dead letter). Only the rows whose fence it won come back.
        self.settle = f"""
WITH t AS (
    SELECT * FROM unnest($1::int[], $2::bigint[], $3::int[], $4::int[], $5::int[], $6::bigint[],
                         $7::int[], $8::text[])
        AS t(part, delivery_id, run, subscription_id, event_part, event_id, attempt, outcome)
), logged AS (
    INSERT INTO {s}.log (part, delivery_id, run, subscription_id, status, worker_id)
    SELECT part, delivery_id, run, subscription_id,
           CASE WHEN outcome = 'failed' AND attempt >= $9 THEN 'dead' ELSE outcome END, $10
    FROM t
    ON CONFLICT DO NOTHING
    RETURNING delivery_id, run, status
), retried AS (
    INSERT INTO {s}.ready (slot, delivery_id, run, subscription_id, event_part, event_id, run_at, attempt)
    SELECT {cur}, t.delivery_id, t.run + 1, t.subscription_id, t.event_part, t.event_id,
           now() + $11 * interval '1 second', t.attempt + 1
    FROM logged l JOIN t USING (delivery_id, run) WHERE l.status = 'failed'
), buried AS (
    INSERT INTO {s}.dead_letters (delivery_id, run, subscription_id, event_part, event_id, reason)
    SELECT t.delivery_id, t.run, t.subscription_id, t.event_part, t.event_id, 'failed'
    FROM logged l JOIN t USING (delivery_id, run) WHERE l.status = 'dead'
)
SELECT delivery_id, run, status FROM logged"""
        # Expired claims without a log row: lease_expired (or dead) under the claim's key, and a
        # new run. $1: the slots to look in; $2: the lower bound of lease_until (the cursor).
        self.rescue = f"""
WITH expired AS (
    SELECT c.slot, c.delivery_id, c.run, {b("c.claimed_at")} AS part, r.subscription_id,
           r.event_part, r.event_id, r.attempt
    FROM {s}.claims c JOIN {s}.ready r
      ON r.slot = c.slot AND r.delivery_id = c.delivery_id AND r.run = c.run AND r.slot = ANY($1::int[])
    WHERE c.slot = ANY($1::int[]) AND c.lease_until < now() AND c.lease_until >= $2
      AND NOT EXISTS (SELECT 1 FROM {s}.log l
                      WHERE l.part = {b("c.claimed_at")} AND l.delivery_id = c.delivery_id AND l.run = c.run)
), logged AS (
    INSERT INTO {s}.log (part, delivery_id, run, subscription_id, status, worker_id)
    SELECT part, delivery_id, run, subscription_id,
           CASE WHEN attempt >= $3 THEN 'dead' ELSE 'lease_expired' END, 0
    FROM expired
    ON CONFLICT DO NOTHING
    RETURNING delivery_id, run, status
), retried AS (
    INSERT INTO {s}.ready (slot, delivery_id, run, subscription_id, event_part, event_id, run_at, attempt)
    SELECT {cur}, e.delivery_id, e.run + 1, e.subscription_id, e.event_part, e.event_id, now(),
           e.attempt + 1
    FROM logged l JOIN expired e USING (delivery_id, run) WHERE l.status = 'lease_expired'
), buried AS (
    INSERT INTO {s}.dead_letters (delivery_id, run, subscription_id, event_part, event_id, reason)
    SELECT e.delivery_id, e.run, e.subscription_id, e.event_part, e.event_id, 'lease_expired'
    FROM logged l JOIN expired e USING (delivery_id, run) WHERE l.status = 'dead'
)
SELECT delivery_id, run, status FROM logged"""
        self.window = f"""
SELECT o.gen, o.slot,
       EXISTS (SELECT 1 FROM {s}.ring_log x WHERE x.gen = o.gen AND x.kind = 'closing') AS closing,
       (SELECT min(x.at) FROM {s}.ring_log x WHERE x.gen = o.gen AND x.kind = 'closing') AS closed_at
FROM {s}.ring_log o
WHERE o.kind = 'open' AND NOT EXISTS (SELECT 1 FROM {s}.ring_log x WHERE x.gen = o.gen AND x.kind = 'pruned')
ORDER BY o.gen"""

    def claim(self, leaf: int | None = None) -> str:
        """The claim: on the parent over ``$1`` (the window's slots), or on one leaf slot."""
        s = self.s

        def b(e: str) -> str:
            return _bucket(e, self.cfg)

        if leaf is None:
            ready, claims = f"{s}.ready", f"{s}.claims"
            where, anti = "r.slot = ANY($1::int[])", "c.slot = r.slot AND c.slot = ANY($1::int[])"
        else:
            ready, claims = f"{s}.ready_{leaf}", f"{s}.claims_{leaf}"
            where, anti = f"r.slot = {leaf} AND $1::int[] IS NOT NULL", "true"
        return f"""
WITH picked AS (
    SELECT r.slot, r.delivery_id, r.run, r.subscription_id, r.event_part, r.event_id, r.attempt, r.run_at
    FROM {ready} r
    WHERE {where} AND r.subscription_id = $2 AND r.run_at <= now()
      AND (r.run_at, r.delivery_id) > ($3::timestamptz, $4::bigint)
      AND NOT EXISTS (SELECT 1 FROM {claims} c
                      WHERE {anti} AND c.delivery_id = r.delivery_id AND c.run = r.run)
    ORDER BY r.run_at, r.delivery_id
    LIMIT $5
    FOR UPDATE OF r SKIP LOCKED
), won AS (
    INSERT INTO {claims} (slot, delivery_id, run, lease_token, lease_until, worker_id, claimed_at)
    SELECT slot, delivery_id, run, $6, now() + $7 * interval '1 second', $8, now() FROM picked
    ON CONFLICT DO NOTHING
    RETURNING slot, delivery_id, run, claimed_at
)
SELECT w.slot, w.delivery_id, w.run, {b("w.claimed_at")} AS part, p.subscription_id, p.event_part,
       p.event_id, p.attempt, p.run_at, length(e.payload) AS size
FROM won w JOIN picked p USING (slot, delivery_id, run)
JOIN {s}.events e ON e.part = p.event_part AND e.id = p.event_id
ORDER BY p.run_at, w.delivery_id"""

    async def create(self, conn: asyncpg.Connection) -> None:
        await conn.execute(_DDL.format(s=self.s))
        for k in range(self.cfg.slots):
            await conn.execute(
                f"CREATE TABLE {self.s}.ready_{k} PARTITION OF {self.s}.ready FOR VALUES IN ({k})"
            )
            await conn.execute(
                f"CREATE TABLE {self.s}.claims_{k} PARTITION OF {self.s}.claims FOR VALUES IN ({k})"
            )
        await conn.execute(f"INSERT INTO {self.s}.ring_log (gen, slot, kind) VALUES (0, 0, 'open')")

    async def current_bucket(self, conn: asyncpg.Connection) -> int:
        return int(await conn.fetchval(f"SELECT {_bucket('now()', self.cfg)}"))

    async def buckets(self, conn: asyncpg.Connection, table: str) -> list[int]:
        rows = await conn.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = $1::regclass",
            f"{self.s}.{table}",
        )
        return sorted(int(r["relname"].rsplit("_", 1)[1]) for r in rows)

    async def premake(self, conn: asyncpg.Connection, ahead: int = 2) -> None:
        """The log's and the events' partitions of the current bucket and the next ``ahead``."""
        now = await self.current_bucket(conn)
        for table in ("log", "events"):
            have = set(await self.buckets(conn, table))
            for b in range(now, now + ahead + 1):
                if b not in have:
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {self.s}.{table}_{b} PARTITION OF {self.s}.{table} "
                        f"FOR VALUES IN ({b})"
                    )


# -- the run's ledger and its checks ------------------------------------------------------------


@dataclass
class Ledger:
    """What the run's clients saw: the published deliveries, the claims and the outcomes they won."""

    published: set[int] = field(default_factory=set)
    claimed: Counter[tuple[int, int]] = field(default_factory=Counter)
    outcomes: dict[tuple[int, int], str] = field(default_factory=dict)
    double_outcomes: list[tuple[int, int]] = field(default_factory=list)
    terminal: Counter[int] = field(default_factory=Counter)
    rescued: set[tuple[int, int]] = field(default_factory=set)
    stale_attempts: int = 0
    stale_won: int = 0  # late completions of runs a rescue had already settled that still won
    stale_raced: int = 0  # late completions tried before any rescue (either side may win)
    lost_leases: int = 0
    expected: int = 0  # deliveries the run publishes
    finished: anyio.Event = field(default_factory=anyio.Event)  # every published delivery is settled
    waiters: dict[tuple[int, int], anyio.Event] = field(default_factory=dict)

    async def rescue_of(self, key: tuple[int, int], timeout: float) -> bool:
        """Wait until a rescue settled run ``key`` (at most ``timeout`` seconds); whether it did."""
        if key not in self.rescued:
            event = self.waiters.setdefault(key, anyio.Event())
            with anyio.move_on_after(timeout):
                await event.wait()
        return key in self.rescued

    def won(self, rows: Sequence[Any], *, rescue: bool = False) -> None:
        for r in rows:
            key = (int(r["delivery_id"]), int(r["run"]))
            if key in self.outcomes:
                self.double_outcomes.append(key)
            self.outcomes[key] = str(r["status"])
            if r["status"] in TERMINAL:
                self.terminal[key[0]] += 1
            if rescue:
                self.rescued.add(key)
                if key in self.waiters:
                    self.waiters.pop(key).set()
        if self.expected and len(self.terminal) >= self.expected:
            self.finished.set()

    @property
    def done(self) -> int:
        return len(self.terminal)


def check(ledger: Ledger, db_log: dict[tuple[int, int], str] | None = None) -> dict[str, Any]:
    """The protocol's promises, from the clients' ledger (and the log rows when they were all kept).

    Every published delivery has exactly one terminal outcome (completed or dead),
    no run was claimed or settled twice, the runs of a delivery are 1..n with every
    run before the last settled as failed or lease_expired, and no late completion
    of a run a rescue had settled won.
    """
    runs: dict[int, list[int]] = {}
    for d, r in ledger.outcomes:
        runs.setdefault(d, []).append(r)
    gaps = 0
    for d, rs in runs.items():
        rs.sort()
        if rs != list(range(1, len(rs) + 1)):
            gaps += 1
        elif any(ledger.outcomes[(d, r)] in TERMINAL for r in rs[:-1]):
            gaps += 1
    statuses = Counter(ledger.outcomes.values())
    out: dict[str, Any] = {
        "deliveries": len(ledger.published),
        "lost": len(ledger.published - set(ledger.terminal)),
        "unknown_outcomes": len(set(runs) - ledger.published),
        "more_than_one_terminal": sum(1 for c in ledger.terminal.values() if c != 1),
        "runs_claimed_twice": sum(1 for c in ledger.claimed.values() if c > 1),
        "runs_settled_twice": len(ledger.double_outcomes),
        "run_sequence_broken": gaps,
        "stale_completions": ledger.stale_attempts,
        "stale_completions_won": ledger.stale_won,
        "stale_completions_raced": ledger.stale_raced,
        "outcomes": dict(sorted(statuses.items())),
    }
    if db_log is not None:
        out["log_rows_disagreeing"] = sum(
            1 for k in set(db_log) | set(ledger.outcomes) if db_log.get(k) != ledger.outcomes.get(k)
        )
    out["ok"] = not any(
        out[k]
        for k in (
            "lost",
            "unknown_outcomes",
            "more_than_one_terminal",
            "runs_claimed_twice",
            "runs_settled_twice",
            "run_sequence_broken",
            "stale_completions_won",
        )
    ) and not out.get("log_rows_disagreeing")
    return out


# -- the leader: rescue, rotation, prune, bucket retention ---------------------------------------


@dataclass
class LeaderStats:
    rotations: int = 0
    rotations_skipped: int = 0
    prunes: int = 0
    prunes_lock_timeout: int = 0
    prunes_lease_open: int = 0
    carried_forward: int = 0
    rescued: int = 0
    buckets_dropped: int = 0
    bucket_drop_lock_timeouts: int = 0
    prune_windows: list[tuple[float, float]] = field(default_factory=list)
    prune_ms: list[float] = field(default_factory=list)
    retention_steps: dict[str, float] = field(default_factory=dict)  # seconds per step of prune_everything
    tick_seconds: dict[str, tuple[float, float]] = field(default_factory=dict)  # per step: total, longest


class Leader:
    """The one process that rotates, prunes and rescues (an advisory lock would elect it)."""

    def __init__(self, ring: Ring, conn: asyncpg.Connection, ledger: Ledger) -> None:
        self.ring, self.conn, self.ledger = ring, conn, ledger
        self.stats = LeaderStats()
        self.rescue_from = 0.0  # epoch seconds: lease_until lower bound of the next rescue scan
        self.last_rotation = time.monotonic()
        self.stopped = anyio.Event()

    async def gens(self) -> list[asyncpg.Record]:
        return list(await self.conn.fetch(self.ring.window))

    async def rescue(self) -> None:
        gens = await self.gens()
        scan_from = self.rescue_from
        now = float(await self.conn.fetchval("SELECT extract(epoch FROM now())"))
        rows = await self.conn.fetch(
            self.ring.rescue,
            [g["slot"] for g in gens],
            _ts(scan_from),
            self.ring.cfg.max_attempts,
        )
        self.ledger.won(rows, rescue=True)
        self.stats.rescued += len(rows)
        # Claims commit a moment after their now(): look back a second on the next scan.
        self.rescue_from = now - 1.0

    async def rotate(self, *, close_all: bool = False) -> None:
        cfg, s = self.ring.cfg, self.ring.s
        gens = await self.gens()
        current = max(g["gen"] for g in gens)
        nxt = current + 1
        if any(g["slot"] == nxt % cfg.slots for g in gens):
            self.stats.rotations_skipped += 1  # the next slot is not pruned yet
        else:
            await self.conn.execute(
                f"INSERT INTO {s}.ring_log (gen, slot, kind) VALUES ($1, $2, 'open')", nxt, nxt % cfg.slots
            )
            self.stats.rotations += 1
            if cfg.analyze_on_rotate:
                sealed = next(g["slot"] for g in gens if g["gen"] == current)
                await self.conn.execute(f"ANALYZE {s}.ready_{sealed}, {s}.claims_{sealed}")
            current = nxt
        lag = 1 if close_all else cfg.close_lag
        open_gens = [g for g in gens if not g["closing"] and g["gen"] <= current - lag]
        # The oldest slot is closed anyway when the ring is about to be full (its unclaimed rows are
        # then carried forward); the others only once nothing in them is left to claim.
        full = len(gens) >= cfg.slots - 1
        for i, g in enumerate(open_gens):
            if close_all or (full and i == 0) or not await self.unclaimed(int(g["slot"])):
                await self.conn.execute(
                    f"INSERT INTO {s}.ring_log (gen, slot, kind) VALUES ($1, $2, 'closing')",
                    g["gen"],
                    g["slot"],
                )
        self.last_rotation = time.monotonic()

    async def unclaimed(self, slot: int) -> bool:
        """Whether a ready row of the slot has no claim. Every claim row of a slot is the claim of one
        of its ready rows, so counting both answers it in two scans; the anti-join planned a nested
        loop over a materialized scan on this shape (4.5 s for 30,000 claimed rows)."""
        s = self.ring.s
        return bool(
            await self.conn.fetchval(
                f"SELECT (SELECT count(*) FROM {s}.ready_{slot}) > (SELECT count(*) FROM {s}.claims_{slot})"
            )
        )

    async def prune(self, *, settle_seconds: float) -> None:
        """Prune every slot closed for at least ``settle_seconds`` (workers refreshed their window)."""
        for g in await self.gens():
            if not g["closing"]:
                continue
            age = float(
                await self.conn.fetchval("SELECT extract(epoch FROM now() - $1::timestamptz)", g["closed_at"])
            )
            if age >= settle_seconds:
                await self.prune_slot(int(g["gen"]), int(g["slot"]))

    async def prune_slot(self, gen: int, slot: int) -> str:
        s, cfg = self.ring.s, self.ring.cfg

        def b(e: str) -> str:
            return _bucket(e, cfg)

        started = time.perf_counter()
        outcome = "pruned"
        try:
            async with self.conn.transaction():
                await self.conn.execute("SET LOCAL lock_timeout = '10ms'")
                await self.conn.execute(
                    f"LOCK TABLE {s}.ready_{slot}, {s}.claims_{slot} IN ACCESS EXCLUSIVE MODE"
                )
                open_leases = await self.conn.fetchval(
                    f"""SELECT count(*) FROM {s}.claims_{slot} c
                        WHERE c.lease_until >= now()
                          AND NOT EXISTS (SELECT 1 FROM {s}.log l WHERE l.part = {b("c.claimed_at")}
                                          AND l.delivery_id = c.delivery_id AND l.run = c.run)"""
                )
                if open_leases:
                    outcome = "lease_open"
                    raise _Abort
                rescued = await self.conn.fetch(
                    self.ring.rescue, [slot], _ts(0.0), cfg.max_attempts
                )  # expired, unsettled claims of the slot: settled before their rows go
                carried = await self.conn.fetchval(
                    f"""WITH moved AS (
                        INSERT INTO {s}.ready (slot, delivery_id, run, subscription_id, event_part, event_id,
                                               run_at, attempt)
                        SELECT (SELECT slot FROM {s}.ring_log WHERE kind = 'open' ORDER BY gen DESC LIMIT 1),
                               r.delivery_id, r.run, r.subscription_id, r.event_part, r.event_id, r.run_at,
                               r.attempt
                        FROM {s}.ready_{slot} r
                        WHERE NOT EXISTS (SELECT 1 FROM {s}.claims_{slot} c
                                          WHERE c.delivery_id = r.delivery_id AND c.run = r.run)
                        RETURNING 1)
                    SELECT count(*) FROM moved"""
                )
                await self.conn.execute(f"TRUNCATE {s}.ready_{slot}, {s}.claims_{slot}")
                await self.conn.execute(
                    f"INSERT INTO {s}.ring_log (gen, slot, kind) VALUES ($1, $2, 'pruned')", gen, slot
                )
            self.ledger.won(rescued, rescue=True)
            self.stats.rescued += len(rescued)
            self.stats.carried_forward += int(carried)
            self.stats.prunes += 1
        except _Abort:
            self.stats.prunes_lease_open += 1
        except asyncpg.exceptions.LockNotAvailableError:
            outcome = "lock_timeout"
            self.stats.prunes_lock_timeout += 1
        ended = time.perf_counter()
        self.stats.prune_windows.append((started, ended))
        self.stats.prune_ms.append((ended - started) * 1000)
        return outcome

    async def drop_buckets(self, *, keep: int | None = None) -> None:
        """Drop the buckets over ``keep`` behind the current one that the ring no longer needs: an event
        bucket once no ready row refers to it, a log bucket once no claim row was made in it (the rescue
        and the prune read a claim's log row in its bucket: without it, a settled claim looks open)."""
        s = self.ring.s
        keep = self.ring.cfg.keep_buckets if keep is None else keep
        now = await self.ring.current_bucket(self.conn)
        floors = {
            "events": await self.conn.fetchval(f"SELECT min(event_part) FROM {s}.ready"),
            "log": await self.conn.fetchval(
                f"SELECT {_bucket('min(claimed_at)', self.ring.cfg)} FROM {s}.claims"
            ),
        }
        for table in ("log", "events"):
            for bucket in await self.ring.buckets(self.conn, table):
                if bucket >= now - keep or (floors[table] is not None and bucket >= floors[table]):
                    continue
                try:
                    async with self.conn.transaction():
                        await self.conn.execute("SET LOCAL lock_timeout = '10ms'")
                        await self.conn.execute(f"DROP TABLE {s}.{table}_{bucket}")
                    self.stats.buckets_dropped += 1
                except asyncpg.exceptions.LockNotAvailableError:
                    self.stats.bucket_drop_lock_timeouts += 1

    async def tick(self) -> None:
        cfg = self.ring.cfg
        await self.timed("premake", self.ring.premake(self.conn))  # buckets exist before they are due
        await self.timed("rescue", self.rescue())
        if time.monotonic() - self.last_rotation >= cfg.rotate_seconds:
            await self.timed("rotate", self.rotate())
            await self.timed("drop_buckets", self.drop_buckets())
        await self.timed("prune", self.prune(settle_seconds=2 * cfg.tick_seconds))

    async def timed(self, name: str, step: Awaitable[None]) -> None:
        """Run one step of a tick, adding its seconds to ``stats.tick_seconds`` (total and longest)."""
        started = time.perf_counter()
        await step
        took = time.perf_counter() - started
        total, longest = self.stats.tick_seconds.get(name, (0.0, 0.0))
        self.stats.tick_seconds[name] = (total + took, max(longest, took))

    async def run(self, stop: anyio.Event) -> None:
        try:
            while not stop.is_set():
                await self.tick()
                with anyio.move_on_after(self.ring.cfg.tick_seconds):
                    await stop.wait()
        finally:
            self.stopped.set()

    async def prune_everything(self) -> None:
        """Retention at the end of a run: rotate until every slot but the current one is pruned, then
        drop every log and event bucket (a retention of zero)."""
        spent = self.stats.retention_steps

        async def timed(name: str, step: Awaitable[None]) -> None:
            started = time.perf_counter()
            await step
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

        for _ in range(3 * self.ring.cfg.slots):
            await timed("rescue", self.rescue())
            await timed("rotate", self.rotate(close_all=True))
            await timed("prune", self.prune(settle_seconds=0.0))
            if len(await self.gens()) == 1:
                break
        await self.rotate(close_all=True)  # the current slot is empty: one more turn closes the last
        await timed("prune", self.prune(settle_seconds=0.0))
        await timed("drop_buckets", self.drop_buckets(keep=-10))


class _Abort(Exception):
    pass


def _ts(epoch: float) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


_START = _ts(0.0)


# -- workers -------------------------------------------------------------------------------------


@dataclass
class Latencies:
    claims: list[tuple[float, float]] = field(default_factory=list)  # (start, end), perf_counter


def _position(rows: Sequence[asyncpg.Record]) -> tuple[Any, int]:
    last = max(rows, key=lambda r: (r["run_at"], r["delivery_id"]))
    return (last["run_at"], int(last["delivery_id"]))


class Worker:
    """One claiming connection: claim a batch, settle it (complete, fail), leave a few to expire."""

    def __init__(
        self,
        ring: Ring,
        dsn: str,
        conn: asyncpg.Connection,
        wid: int,
        ledger: Ledger,
        lat: Latencies,
        rng: random.Random,
        cursors: dict[Any, tuple[Any, int]],
        full_scans: dict[Any, float],
    ) -> None:
        self.dsn = dsn
        self.cursor = cursors  # shared by the process's workers: where their claims start
        self.full_scan_at = full_scans  # shared too: when one of them last claimed from the start
        self.ring, self.conn, self.wid, self.ledger, self.lat, self.rng = ring, conn, wid, ledger, lat, rng
        self.window: list[int] = []
        self.window_at = 0.0
        self.parent_claim = ring.claim()
        self.leaf_claims = {k: ring.claim(k) for k in range(ring.cfg.slots)}

    async def refresh(self) -> None:
        if time.monotonic() - self.window_at >= self.ring.cfg.tick_seconds:
            rows = await self.conn.fetch(self.ring.window)
            self.window = [int(r["slot"]) for r in rows if not r["closing"]]
            self.window_at = time.monotonic()

    async def _claim_one(self, query: str, key: Any, sub: int, limit: int) -> list[asyncpg.Record]:
        """A claim after the process's cursor; from the start at least each second, and when the cursor's
        claim comes up short (at most every 100 ms in the process): rows with an earlier run_at (carried
        forward, or passed over while another claim held them) sit behind the cursor. A claim from the
        start moves the cursor back to the head it found."""
        cfg = self.ring.cfg
        token = self.rng.getrandbits(62)
        args = (self.window, sub)
        tail = (token, cfg.lease_seconds, self.wid)
        now = time.monotonic()
        rows: list[asyncpg.Record] = []
        cursor = self.cursor.get(key)
        since_full = now - self.full_scan_at.get(key, 0.0)
        full = cursor is None or since_full >= 1.0
        if not full and cursor is not None:
            rows = await self._timed(query, *args, *cursor, limit, *tail)
            if rows:
                self.cursor[key] = max(self.cursor[key], _position(rows))
            full = len(rows) < limit and since_full >= 0.1
        if full and len(rows) < limit:
            self.full_scan_at[key] = now
            head = await self._timed(query, *args, _START, 0, limit - len(rows), *tail)
            if head:
                self.cursor[key] = _position(head)
            rows += head
        return rows

    async def _timed(self, query: str, *args: Any) -> list[asyncpg.Record]:
        started = time.perf_counter()
        rows = list(await self.conn.fetch(query, *args))
        self.lat.claims.append((started, time.perf_counter()))
        return rows

    async def claim(self, sub: int) -> list[asyncpg.Record]:
        await self.refresh()
        if not self.window:
            return []
        if self.ring.cfg.claim_mode != "leaf":
            return await self._claim_one(self.parent_claim, sub, sub, self.ring.cfg.batch)
        rows: list[asyncpg.Record] = []
        for slot in self.window:  # oldest slot first
            rows += await self._claim_one(
                self.leaf_claims[slot], (sub, slot), sub, self.ring.cfg.batch - len(rows)
            )
            if len(rows) >= self.ring.cfg.batch:
                break
        return rows

    async def settle(self, rows: Sequence[asyncpg.Record], outcomes: Sequence[str]) -> list[asyncpg.Record]:
        cfg = self.ring.cfg
        arrays = [[r[c] for r in rows] for c in _SETTLE_COLUMNS]
        return list(
            await self.conn.fetch(
                self.ring.settle, *arrays, list(outcomes), cfg.max_attempts, self.wid, cfg.backoff_seconds
            )
        )

    async def run(self, subs: Sequence[int], stop: anyio.Event, tg: anyio.abc.TaskGroup) -> None:
        cfg = self.ring.cfg
        turn = self.wid
        idle = 0
        while not stop.is_set():
            sub = subs[turn % len(subs)]
            turn += 1
            rows = await self.claim(sub)
            for r in rows:
                self.ledger.claimed[(int(r["delivery_id"]), int(r["run"]))] += 1
            if not rows:
                idle += 1
                if idle >= len(subs):
                    await anyio.sleep(0.005)
                    idle = 0
                continue
            idle = 0
            kept, outcomes, late = [], [], []
            for r in rows:
                roll = self.rng.random()
                if roll < cfg.expire:
                    late.append(r)
                else:
                    kept.append(r)
                    outcomes.append("failed" if roll < cfg.expire + cfg.fail else "completed")
            if kept:
                won = await self.settle(kept, outcomes)
                self.ledger.won(won)
                self.ledger.lost_leases += len(kept) - len(won)
            for r in late:
                tg.start_soon(self.complete_late, r)

    async def complete_late(self, row: asyncpg.Record) -> None:
        """A worker that outlived its lease completes once the rescue settled the run: it must lose."""
        key = (int(row["delivery_id"]), int(row["run"]))
        patience = 10 * self.ring.cfg.lease_seconds + 5 * self.ring.cfg.rotate_seconds
        rescued = await self.ledger.rescue_of(key, patience)
        conn = await asyncpg.connect(self.dsn)
        try:
            won = await conn.fetch(
                self.ring.settle,
                *[
                    [row[c]]
                    for c in ("part", "delivery_id", "run", "subscription_id", "event_part", "event_id")
                ],
                [row["attempt"]],
                ["completed"],
                self.ring.cfg.max_attempts,
                self.wid,
                self.ring.cfg.backoff_seconds,
            )
        finally:
            await conn.close()
        self.ledger.stale_attempts += 1
        if rescued:
            self.ledger.stale_won += len(won)
        else:
            self.ledger.stale_raced += 1
        self.ledger.won(won)


async def _connect(dsn: str, cfg: Config) -> asyncpg.Connection:
    mode = {"custom": "force_custom_plan", "generic": "auto", "leaf": "auto"}[cfg.claim_mode]
    return await asyncpg.connect(dsn, server_settings={"plan_cache_mode": mode})


# -- measuring -----------------------------------------------------------------------------------

_SNAPSHOT = """
SELECT pg_current_wal_lsn()::text AS lsn,
       (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE schemaname = $1)::bigint AS inserts,
       (SELECT coalesce(sum(n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables WHERE schemaname = $1)::bigint
           AS writes,
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = $1)::bigint AS dead,
       (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c
        WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
          AND c.relkind IN ('r', 'm'))::bigint AS bytes,
       (SELECT n_tup_upd + n_tup_del FROM pg_stat_sys_tables WHERE relname = 'pg_class')::bigint
           AS catalog_writes,
       (SELECT sum(n_tup_upd + n_tup_del) FROM pg_stat_sys_tables WHERE schemaname = 'pg_catalog')::bigint
           AS all_catalog_writes,
       (SELECT n_dead_tup FROM pg_stat_sys_tables WHERE relname = 'pg_class')::bigint AS catalog_dead,
       extract(epoch FROM clock_timestamp())::float8 AS at
"""


async def snapshot(dsn: str, schema: str) -> dict[str, Any]:
    """Counters now, from a fresh statistics snapshot (after the phase's backends flushed theirs)."""
    await anyio.sleep(1.0)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await conn.fetchrow(_SNAPSHOT, schema)
        assert row is not None
        return dict(row)
    finally:
        await conn.close()


# The scratch database's WAL between LSNs, per phase: records on its relations (catalogs
# included, whatever their filenode was then) and the records of transactions that wrote them.
_OWN_WAL = """
WITH r AS (
    SELECT start_lsn, xid, record_length,
           coalesce(block_ref, '') ~ ('rel \\d+/' || (SELECT oid FROM pg_database
                                                     WHERE datname = current_database()) || '/') AS ours
    FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
), x AS (SELECT DISTINCT xid FROM r WHERE ours AND xid <> 0)
SELECT coalesce(sum(record_length) FILTER (WHERE start_lsn < $3::text::pg_lsn), 0)::bigint AS a,
       coalesce(sum(record_length) FILTER (WHERE start_lsn >= $3::text::pg_lsn
                                             AND start_lsn < $4::text::pg_lsn), 0)::bigint AS b,
       coalesce(sum(record_length) FILTER (WHERE start_lsn >= $4::text::pg_lsn), 0)::bigint AS c
FROM r WHERE ours OR xid IN (SELECT xid FROM x)
"""


async def own_wal(dsn: str, lsns: Sequence[str]) -> list[int]:
    """The WAL bytes of each of the three phases bounded by ``lsns`` (four LSNs)."""
    conn = await asyncpg.connect(dsn)
    try:
        # pg_walinspect reads flushed WAL only: wait for the end to be flushed (background writer),
        # then read no further than what is.
        end = lsns[3]
        for _ in range(40):
            if await conn.fetchval("SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn", end):
                break
            await anyio.sleep(0.05)
        end = await conn.fetchval("SELECT least($1::text::pg_lsn, pg_current_wal_flush_lsn())::text", end)
        row = await conn.fetchrow(_OWN_WAL, lsns[0], end, lsns[1], lsns[2])
        assert row is not None
        return [int(row["a"]), int(row["b"]), int(row["c"])]
    finally:
        await conn.close()


def _percentiles(ms: Sequence[float]) -> dict[str, float | None]:
    if not ms:
        return {"count": 0, "p50_ms": None, "p99_ms": None}
    s = sorted(ms)
    return {
        "count": len(s),
        "p50_ms": round(s[len(s) // 2], 3),
        "p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))], 3),
    }


async def measured(
    dsn: str, schema: str, n: int, phases: Sequence[Callable[[], Awaitable[None]]]
) -> dict[str, Any]:
    """Run the three phases, snapshotting the counters around each; per-delivery figures."""
    snaps = [await snapshot(dsn, schema)]
    seconds = []
    for phase in phases:
        started = time.perf_counter()
        await phase()
        seconds.append(time.perf_counter() - started)
        snaps.append(await snapshot(dsn, schema))
    started = time.perf_counter()
    wal = await own_wal(dsn, [s["lsn"] for s in snaps])
    wal_seconds = time.perf_counter() - started
    per: dict[str, dict[str, float]] = {}
    for i, name in enumerate(PHASES):
        a, b = snaps[i], snaps[i + 1]
        per[name] = {
            "updates_deletes": (b["writes"] - a["writes"]) / n,
            "inserts": (b["inserts"] - a["inserts"]) / n,
            "wal_bytes": wal[i] / n,
            "size_growth_bytes": (b["bytes"] - a["bytes"]) / n,
            "n_dead_tup_at_end": b["dead"],
            "pg_class_updates_deletes": b["catalog_writes"] - a["catalog_writes"],
            "pg_catalog_updates_deletes": b["all_catalog_writes"] - a["all_catalog_writes"],
            "seconds": seconds[i],
        }
    per["total"] = {k: sum(p[k] for p in per.values()) for k in per["publish"] if k != "n_dead_tup_at_end"}
    per["total"]["n_dead_tup_at_end"] = per["retention"]["n_dead_tup_at_end"]
    minutes = sum(seconds) / 60
    return {
        "wal_read_seconds": wal_seconds,
        "per_delivery": per,
        "pg_class_updates_deletes_per_minute": per["total"]["pg_class_updates_deletes"] / max(minutes, 1e-9),
        "pg_catalog_updates_deletes_per_minute": per["total"]["pg_catalog_updates_deletes"]
        / max(minutes, 1e-9),
        "pg_class_n_dead_tup_at_end": snaps[-1]["catalog_dead"],
        "table_index_bytes_at_peak_per_delivery": max(s["bytes"] for s in snaps) / n,
    }


# -- one prototype run ---------------------------------------------------------------------------


async def run_prototype(
    dsn: str, cfg: Config, *, hold: bool = False, hold_seconds: float = 300.0, measure: bool = True
) -> dict[str, Any]:
    """Publish, drain (with the leader rotating, pruning and rescuing), retention; figures and checks.

    Without ``measure``, no counters are read (no pg_walinspect needed): the checks only.
    """
    ring = Ring(f"ring_{uuid.uuid4().hex[:10]}", cfg)
    ledger = Ledger(expected=cfg.deliveries)
    lat = Latencies()
    rng = random.Random(cfg.seed)
    setup = await asyncpg.connect(dsn)
    out: dict[str, Any] = {"config": dataclasses.asdict(cfg), "held_xmin": hold}
    try:
        await _make_schema(dsn, ring)
        async with anyio.create_task_group() as ticker_tg:
            # Subscriptions: ids 1..n (the prototype keeps no subscriptions table).
            subs = list(range(1, cfg.subscriptions + 1))
            leader_conn = await _connect(dsn, cfg)
            leader = Leader(ring, leader_conn, ledger)
            stop_leader = anyio.Event()
            drain_time: dict[str, float] = {}

            async def publish() -> None:
                if cfg.steady:
                    return  # the drain publishes
                await publish_all()

            async def publish_all() -> None:
                await _publish_all(dsn, ring, subs, ledger)

            async def drain() -> None:
                conns = [await _connect(dsn, cfg) for _ in range(cfg.workers)]
                cursors: dict[Any, tuple[Any, int]] = {}
                full_scans: dict[Any, float] = {}
                stop = anyio.Event()
                await ring.premake(leader_conn, ahead=4)
                started = time.perf_counter()
                ticker_tg.start_soon(leader.run, stop_leader)
                try:
                    async with anyio.create_task_group() as tg:
                        for i, c in enumerate(conns):
                            seed = random.Random(rng.getrandbits(32))
                            w = Worker(ring, dsn, c, i + 1, ledger, lat, seed, cursors, full_scans)
                            tg.start_soon(w.run, subs, stop, tg)
                        if cfg.steady:
                            tg.start_soon(publish_all)
                        await ledger.finished.wait()
                        drain_time["seconds"] = time.perf_counter() - started
                        stop.set()
                finally:
                    for c in conns:
                        await c.close()

            async def retention() -> None:
                steps = out["retention_seconds"] = {}
                started = time.perf_counter()
                stop_leader.set()
                await leader.stopped.wait()
                steps["leader_stop"] = time.perf_counter() - started
                # The checks read the log before retention drops it.
                out["open_work_at_end"], db_log = await _open_work(
                    setup, ring, leader.stats.buckets_dropped == 0
                )
                if db_log is not None:
                    out["db_log"] = db_log
                steps["checks"] = time.perf_counter() - started - steps["leader_stop"]
                await leader.prune_everything()
                # A busy backend flushes its table statistics at most each second, and an idle one up to
                # 10 s later: the leader's connection ends here so its counts land in this run's figures.
                await leader_conn.close()
                steps["prune_everything"] = (
                    time.perf_counter() - started - steps["checks"] - steps["leader_stop"]
                )

            figures: dict[str, Any] = {}
            if measure:
                async with held_horizon(dsn, hold, hold_seconds) as held:
                    figures = await measured(dsn, ring.name, cfg.deliveries, [publish, drain, retention])
                out.update(held)
            else:
                for phase in (publish, drain, retention):
                    await phase()
            stop_leader.set()
            await leader_conn.close()  # closed already after a retention phase: a no-op then
    finally:
        await setup.execute(f"DROP SCHEMA IF EXISTS {ring.s} CASCADE")
        await setup.close()
    _report(out, ledger, leader.stats, lat)
    out["drain_per_second"] = cfg.deliveries / drain_time["seconds"]
    out["drain_seconds"] = drain_time["seconds"]
    out.update(figures)
    return out


async def _make_schema(dsn: str, ring: Ring) -> None:
    """The ring's schema, made on a connection of its own, closed (its statistics flushed) before
    the counters are first read."""
    maker = await asyncpg.connect(dsn)
    try:
        await ring.create(maker)
        await ring.premake(maker, ahead=4)
    finally:
        await maker.close()


async def _publish_all(dsn: str, ring: Ring, subs: list[int], ledger: Ledger) -> None:
    """Publish the run's events in batches (paced at ``publish_rate`` when steady)."""
    cfg = ring.cfg
    conn = await asyncpg.connect(dsn)
    try:
        paced = made = time.perf_counter()
        for start in range(0, cfg.events, cfg.publish_batch):
            if time.perf_counter() - made >= cfg.bucket_seconds / 2:  # no leader runs while publishing
                await ring.premake(conn, ahead=4)
                made = time.perf_counter()
            if cfg.steady and cfg.publish_rate:
                due = paced + start * cfg.subscriptions / cfg.publish_rate
                await anyio.sleep(max(0.0, due - time.perf_counter()))
            count = min(cfg.publish_batch, cfg.events - start)
            payloads = [b'{"n": %d}' % i for i in range(start, start + count)]
            ids = await conn.fetch(ring.publish, payloads, subs)
            ledger.published.update(int(r["delivery_id"]) for r in ids)
        # As today's benchmark does after publishing: a fresh partition has no statistics, and
        # without them the claim is planned as a sort of the whole slot (see the results).
        await conn.execute(f"ANALYZE {ring.s}.ready, {ring.s}.claims, {ring.s}.events")
    finally:
        await conn.close()


async def _open_work(
    conn: asyncpg.Connection, ring: Ring, read_log: bool
) -> tuple[dict[str, int], dict[tuple[int, int], str] | None]:
    """Ready rows nobody claimed and claims nobody settled (both 0 once drained); the log's rows."""
    s = ring.s
    row = await conn.fetchrow(
        f"""SELECT (SELECT count(*) FROM {s}.ready r WHERE NOT EXISTS (
                        SELECT 1 FROM {s}.claims c WHERE c.slot = r.slot
                        AND c.delivery_id = r.delivery_id AND c.run = r.run)) AS unclaimed,
                   (SELECT count(*) FROM {s}.claims c WHERE NOT EXISTS (
                        SELECT 1 FROM {s}.log l WHERE l.part = {_bucket("c.claimed_at", ring.cfg)}
                        AND l.delivery_id = c.delivery_id AND l.run = c.run)) AS unsettled"""
    )
    assert row is not None
    if not read_log:
        return dict(row), None
    rows = await conn.fetch(f"SELECT delivery_id, run, status FROM {s}.log")
    return dict(row), {(int(r["delivery_id"]), int(r["run"])): str(r["status"]) for r in rows}


def _report(out: dict[str, Any], ledger: Ledger, stats: LeaderStats, lat: Latencies) -> None:
    """The checks, the leader's counts and the claim latencies (split by an overlapping prune)."""
    out["check"] = check(ledger, out.pop("db_log", None))
    out["check"]["open_work_at_end"] = out.pop("open_work_at_end")
    out["check"]["ok"] = out["check"]["ok"] and not any(out["check"]["open_work_at_end"].values())
    leader = dataclasses.asdict(stats)
    windows = leader.pop("prune_windows")
    leader["prune_ms"] = _percentiles(leader.pop("prune_ms"))
    out["leader"] = leader
    during: list[float] = []
    outside: list[float] = []
    for a, b in lat.claims:
        (during if any(a < e and b > s for s, e in windows) else outside).append((b - a) * 1000)
    out["claim_latency"] = {"during_prune": _percentiles(during), "without_prune": _percentiles(outside)}
    out["lost_leases"] = ledger.lost_leases


# -- one run of today's tables --------------------------------------------------------------------


async def run_today(dsn: str, n: int, *, hold: bool = False, hold_seconds: float = 300.0) -> dict[str, Any]:
    """The phases of benchmarks/storage.py on a real Bus, measured as the prototype is."""
    schema = f"eventbus_ring_today_{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {"held_xmin": hold, "n": n}
    claims: list[float] = []
    rate: dict[str, float] = {}

    async def phase(name: str) -> None:
        async with _bus(dsn, schema) as bus:
            if name == "retention":
                # What autovacuum would have done by then: without it the retention walk plans on the
                # statistics of a table full of pending rows and takes minutes per 30,000 deliveries.
                await bus.backend.schema.analyze()
            if name != "drain":
                await _phase(bus, name, n)
                return
            backend: Any = bus.backend
            deliveries = backend.deliveries
            original = deliveries.claim

            async def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    claims.append((time.perf_counter() - started) * 1000)

            deliveries.claim = timed
            rate["drain"] = await _drain(bus)

    def bound(name: str) -> Callable[[], Awaitable[None]]:
        return lambda: phase(name)

    try:
        async with _bus(dsn, schema, migrate=True):
            pass
        async with held_horizon(dsn, hold, hold_seconds) as held:
            figures = await measured(dsn, schema, n, [bound(p) for p in PHASES])
        out.update(held)
    finally:
        async with _bus(dsn, schema) as bus:
            await bus.backend.schema.drop()
    out["drain_per_second"] = rate["drain"]
    out.update(figures)
    out["claim_latency"] = {"without_prune": _percentiles(claims)}
    return out


# -- the generic-plan probe -----------------------------------------------------------------------


async def plan_probe(dsn: str, seconds: float = 3.0, rows_per_slot: int = 5_000) -> dict[str, Any]:
    """With slot 0 closed, do claims lock it, and does a 10 ms-bounded TRUNCATE of it get through?

    For each way of writing the claim: ``auto`` (the parent, asyncpg's prepared
    statement, PostgreSQL choosing the plan), ``force_generic_plan``,
    ``force_custom_plan`` and ``leaf`` (the leaf partitions named). First in
    one transaction: eight claims, then the locks held on ``ready_0`` and
    ``claims_0`` and the plans the statement got (``pg_prepared_statements``).
    Then under load: four connections claiming (batches of 10) while the
    pruner tries ``LOCK … ACCESS EXCLUSIVE`` + ``TRUNCATE`` of slot 0 with a
    10 ms lock_timeout every 20 ms; how many got through, and claim latency.
    """
    cfg = Config(slots=4, claim_mode="custom")
    results: dict[str, Any] = {}
    for mode in ("auto", "force_generic_plan", "force_custom_plan", "leaf"):
        ring = Ring(f"ring_probe_{uuid.uuid4().hex[:8]}", cfg)
        setup = await asyncpg.connect(dsn)
        try:
            await ring.create(setup)
            await ring.premake(setup, ahead=4)
            for slot in range(4):
                if slot:
                    await setup.execute(
                        f"INSERT INTO {ring.s}.ring_log (gen, slot, kind) "
                        "VALUES ($1::bigint, $1::int, 'open')",
                        slot,
                    )
                # The rows are published into slot `slot` (the current one at that moment).
                for _ in range(0, rows_per_slot, 5000):
                    await setup.fetch(ring.publish, [b"x"] * 5000, [1])
            await setup.execute(
                "ANALYZE " + ", ".join(f"{ring.s}.{t}" for t in ("ready", "claims", "events"))
            )
            window = [1, 2, 3]
            plan_mode = "auto" if mode == "leaf" else mode
            queries = [ring.claim(k) for k in window] if mode == "leaf" else [ring.claim()]

            conn = await asyncpg.connect(dsn, server_settings={"plan_cache_mode": plan_mode})
            try:
                async with conn.transaction():
                    for i in range(8):
                        await conn.fetch(queries[i % len(queries)], window, 1, _START, 0, 10, i, 30.0, 1)
                    locks = await conn.fetch(
                        "SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                        "WHERE l.pid = pg_backend_pid() AND c.relname IN ('ready_0', 'claims_0') "
                        "AND c.relnamespace = $1::regnamespace ORDER BY 1, 2",
                        ring.name,
                    )
                plans = await conn.fetchrow(
                    "SELECT sum(generic_plans)::int AS generic, sum(custom_plans)::int AS custom "
                    "FROM pg_prepared_statements WHERE statement LIKE '%FOR UPDATE OF r SKIP LOCKED%' "
                    "AND statement NOT LIKE '%pg_prepared_statements%'"
                )
            finally:
                await conn.close()
            load = await _probe_load(dsn, ring, plan_mode, queries, window, seconds)
            results[mode] = {
                "locks_on_closed_slot": [f"{r['relname']}:{r['mode']}" for r in locks],
                "plans": dict(plans) if plans else None,
                **load,
            }
        finally:
            await setup.execute(f"DROP SCHEMA IF EXISTS {ring.s} CASCADE")
            await setup.close()
    return results


async def _probe_load(
    dsn: str, ring: Ring, plan_mode: str, queries: list[str], window: list[int], seconds: float
) -> dict[str, Any]:
    stop = anyio.Event()
    lat: list[tuple[float, float]] = []
    attempts: list[tuple[float, float, str]] = []

    async def claimer() -> None:
        conn = await asyncpg.connect(dsn, server_settings={"plan_cache_mode": plan_mode})
        try:
            i = 0
            while not stop.is_set():
                i += 1
                started = time.perf_counter()
                with contextlib.suppress(_Abort):
                    async with conn.transaction():  # rolled back: the rows stay for the next claim
                        await conn.fetch(queries[i % len(queries)], window, 1, _START, 0, 10, i, 30.0, 1)
                        raise _Abort
                lat.append((started, time.perf_counter()))
        finally:
            await conn.close()

    async def pruner() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await anyio.sleep(0.3)  # the claimers' statements are past their fifth execution
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    async with conn.transaction():
                        await conn.execute("SET LOCAL lock_timeout = '10ms'")
                        await conn.execute(
                            f"LOCK TABLE {ring.s}.ready_0, {ring.s}.claims_0 IN ACCESS EXCLUSIVE MODE"
                        )
                        await conn.execute(f"TRUNCATE {ring.s}.ready_0, {ring.s}.claims_0")
                    outcome = "ok"
                except asyncpg.exceptions.LockNotAvailableError:
                    outcome = "lock_timeout"
                attempts.append((started, time.perf_counter(), outcome))
                await anyio.sleep(0.02)
        finally:
            await conn.close()

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(claimer)
        tg.start_soon(pruner)
        await anyio.sleep(seconds)
        stop.set()
    windows = [(a, b) for a, b, _ in attempts]
    during: list[float] = []
    outside: list[float] = []
    for a, b in lat:
        (during if any(a < e and b > s for s, e in windows) else outside).append((b - a) * 1000)
    outcomes = Counter(o for _, _, o in attempts)
    return {
        "truncate_attempts": len(attempts),
        "truncate_ok": outcomes["ok"],
        "truncate_lock_timeouts": outcomes["lock_timeout"],
        "claims_per_second": len(lat) / seconds,
        "claim_latency_during_truncate": _percentiles(during),
        "claim_latency_otherwise": _percentiles(outside),
    }


# -- the sitting ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def scratch_database(dsn: str) -> AsyncIterator[str]:
    """A database of the sitting's own (its catalogs and WAL are the run's), with pg_walinspect."""
    name = f"eventbus_ring_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        scratch = urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))
        conn = await asyncpg.connect(scratch)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        finally:
            await conn.close()
        try:
            async with wal_kept(dsn, name):
                yield scratch
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def _summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["drain_per_second"] for r in runs]
    total = [r["per_delivery"]["total"] for r in runs]

    def med(key: str) -> float:
        return float(statistics.median(t[key] for t in total))

    return {
        "drain_per_second_median": statistics.median(rates),
        "drain_per_second_range": [min(rates), max(rates)],
        "updates_deletes_per_delivery": med("updates_deletes"),
        "wal_bytes_per_delivery": med("wal_bytes"),
        "peak_table_index_bytes_per_delivery": statistics.median(
            r["table_index_bytes_at_peak_per_delivery"] for r in runs
        ),
        "pg_class_updates_deletes_per_minute": statistics.median(
            r["pg_class_updates_deletes_per_minute"] for r in runs
        ),
    }


async def sitting(args: argparse.Namespace) -> dict[str, Any]:
    cfg = Config(
        events=args.deliveries // args.subscriptions,
        subscriptions=args.subscriptions,
        workers=args.workers,
        batch=args.batch,
        slots=args.slots,
        rotate_seconds=args.rotate_seconds,
        claim_mode=args.claim_mode,
        fail=args.fail,
    )
    out: dict[str, Any] = {
        "benchmark": "append_only",
        "load1_start": os.getloadavg()[0],
        "config": vars(args),
    }
    async with scratch_database(args.dsn) as dsn:
        proto, today = [], []
        for i in range(args.runs):  # interleaved, so both layouts see the same machine load
            proto.append(await run_prototype(dsn, dataclasses.replace(cfg, seed=i + 1)))
            _log("prototype", proto[-1])
            if not args.skip_today:
                today.append(await run_today(dsn, cfg.deliveries))
                _log("today", today[-1])
        proto_held = await run_prototype(dsn, cfg, hold=True, hold_seconds=args.hold_seconds)
        _log("prototype held", proto_held)
        out["prototype"] = {"runs": proto, "held": proto_held, "summary": _summary(proto)}
        out["prototype"]["held_over_clean_drain"] = (
            proto_held["drain_per_second"] / out["prototype"]["summary"]["drain_per_second_median"]
        )
        if not args.skip_today:
            today_held = await run_today(dsn, cfg.deliveries, hold=True, hold_seconds=args.hold_seconds)
            _log("today held", today_held)
            out["today"] = {"runs": today, "held": today_held, "summary": _summary(today)}
            out["today"]["held_over_clean_drain"] = (
                today_held["drain_per_second"] / out["today"]["summary"]["drain_per_second_median"]
            )
        race = Config(
            events=args.race_deliveries // 2,
            subscriptions=2,
            workers=4,
            batch=20,
            slots=6,
            rotate_seconds=0.3,
            close_lag=2,
            tick_seconds=0.05,
            lease_seconds=0.5,
            fail=0.05,
            expire=0.01,
            bucket_seconds=2.0,
            keep_buckets=30,
            claim_mode=args.claim_mode,
            steady=True,
            publish_rate=args.race_deliveries / 4,
        )
        out["race"] = await run_prototype(dsn, race)
        _log("race", out["race"])
        steady = dataclasses.replace(
            cfg,
            events=args.steady_deliveries // cfg.subscriptions,
            steady=True,
            publish_rate=args.steady_rate,
        )
        out["steady"] = await run_prototype(dsn, steady)
        _log("steady", out["steady"])
        out["plan_probe"] = await plan_probe(dsn, seconds=args.probe_seconds)
        print(json.dumps(out["plan_probe"], indent=1), flush=True)
    out["load1_end"] = os.getloadavg()[0]
    return out


def _log(what: str, run: dict[str, Any]) -> None:
    t = run["per_delivery"]["total"]
    check_ok = run.get("check", {}).get("ok", "-")
    print(
        f"{what}: {run['drain_per_second']:,.0f}/s, upd+del {t['updates_deletes']:.4f}, "
        f"WAL {t['wal_bytes']:.0f} B, "
        f"pg_class/min {run['pg_class_updates_deletes_per_minute']:.0f}, claims {run['claim_latency']}, "
        f"check {check_ok}, seconds {[round(p['seconds'], 1) for p in run['per_delivery'].values()]}, "
        f"WAL read {run['wal_read_seconds']:.1f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--deliveries", type=int, default=30_000)
    parser.add_argument("--subscriptions", type=int, default=1)
    parser.add_argument(
        "--runs", type=int, default=3, help="Clean runs of each layout (drain median and range)."
    )
    parser.add_argument("--workers", type=int, default=8, help="Claiming connections of the prototype.")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rotate-seconds", type=float, default=1.0)
    parser.add_argument("--claim-mode", choices=("custom", "generic", "leaf"), default="custom")
    parser.add_argument("--fail", type=float, default=0.01, help="Fraction of runs whose handler fails.")
    parser.add_argument("--hold-seconds", type=float, default=300.0)
    parser.add_argument("--race-deliveries", type=int, default=6_000)
    parser.add_argument(
        "--steady-deliveries", type=int, default=15_000, help="The steady run: published while draining."
    )
    parser.add_argument("--steady-rate", type=float, default=2_000.0, help="Its deliveries per second.")
    parser.add_argument("--probe-seconds", type=float, default=3.0)
    parser.add_argument("--skip-today", action="store_true", help="Measure the prototype only.")
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    out = asyncio.run(sitting(ns))
    summary = {
        k: out[k]["summary"] | {"held_over_clean_drain": out[k]["held_over_clean_drain"]}
        for k in ("prototype", "today")
        if k in out
    }
    print(json.dumps(summary, indent=1))
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(out, f, indent=2, default=str)


if __name__ == "__main__":
    main()
