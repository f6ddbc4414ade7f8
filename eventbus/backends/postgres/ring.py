"""The append-only hot path on PostgreSQL (``Bus(dsn, append_only=True)``).

Every queue on PostgreSQL that marks a row per status change leaves dead
tuples behind: an UPDATE at claim and one at completion, two per delivery,
that autovacuum must clean and that a held-back xmin horizon keeps in the
table and its indexes. On this path the ordinary life of a delivery (published,
claimed once, completed) is three inserts and nothing else:

- **publish** inserts a ready row into the ring's current *slot* (``ring_ready``,
  ``LIST`` partitioned by slot, 16 slots);
- **claim** reads ready rows of the window's slots in delivery id order that no
  claim row has taken (an anti-join), ``FOR UPDATE SKIP LOCKED``, and inserts a
  claim row each (``ring_claims``, same slot) ``ON CONFLICT DO NOTHING``: the
  claim table's primary key is the first fence, so a claimer whose snapshot
  predates another's claim loses on the key;
- **completion** inserts an outcome row into ``delivery_log`` (partitioned by the
  claim's day) ``ON CONFLICT DO NOTHING``: its key ``(claimed_on, delivery_id)``
  is the second fence, shared by everything else that settles a claim.

Everything else moves the delivery into ``deliveries`` and is done there by
today's statements, unchanged: a failure (then retries and dead letters), a
release, a lease renewal (a long handler: its first renewal moves it, awa's
"lazy materialization" of long leases), an expired lease, a lost worker. A move
inserts the ``deliveries`` row as ``processing`` under the same lease and the
outcome ``moved`` under the claim's key, so a completion that comes after it
loses the ring's fence and completes the ``deliveries`` row instead. Ordered,
delayed and prioritised deliveries, and those of a subscription whose backfill
is owed, never enter the ring (see ``_ring_route`` in ``delivery.sql``).

**The ring's upkeep**, one worker at a time (a transaction-scoped advisory
lock), every :data:`UPKEEP_SECONDS`:

1. *rotate*: a new generation opens the next slot when the current one holds
   :data:`SLOT_ROWS` rows, or any row and is :data:`SLOT_SECONDS` old, if the
   next slot is empty (pruned); the sealed slot is ANALYZEd so claims are
   planned on its real size;
2. *close*: a sealed slot whose rows are all claimed is marked ``closing``;
   so is one older than :data:`MAX_AGE_SECONDS` whatever it holds, and the
   oldest when the ring is full. Workers stop claiming from a closing slot
   within :data:`WINDOW_SECONDS`;
3. *prune* a slot closing for :data:`SETTLE_SECONDS`, in one transaction:
   lock both partitions (``lock_timeout`` :data:`LOCK_TIMEOUT`, else the next
   turn), move its open claims into ``deliveries`` (live ones too: a claim
   never holds a slot), spill its unclaimed ready rows into ``deliveries`` as
   pending (a backlog older than the ring leaves it: claims there stay one
   index range read at any depth), ``TRUNCATE`` both, mark it ``pruned``.

The hot statements name their slots as a parameter and the bus's connections
plan every statement for its parameters (``plan_cache_mode =
force_custom_plan``): a generic plan of a statement on the parent table locks
every partition, and a TRUNCATE then waits behind every claim (measured in
``benchmarks/results/append_only.md``).

What it leaves: 0 updates and deletes per delivery on this path; a slot's
space returns by TRUNCATE, a day of outcomes by DROP TABLE. The ring's ledger
(``ring_log``) takes three rows per rotation and is trimmed by the upkeep.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ...errors import BackendError
from ...types import DeliveryId
from .._workers import lost_workers
from ._db import PgDb

__all__ = ["RING_SLOTS", "PgRing", "RingStats", "drop_days", "evict", "generations", "to_queue"]

log = logging.getLogger("eventbus.ring")

RING_SLOTS = 16
"""Slots in the ring (the partitions of ``ring_ready`` and ``ring_claims`` made by migration 0024)."""

SLOT_ROWS = 20_000
"""A slot is sealed once it holds this many rows (a claim from the window's start walks few claimed rows)."""

SLOT_SECONDS = 2.0
"""... or once it is this old with a row in it."""

MAX_AGE_SECONDS = 30.0
"""A slot sealed this long is closed whatever it holds: what no claim took by then leaves the ring."""

SETTLE_SECONDS = 0.5
"""A closing slot is pruned once it has been closing this long (every worker's window has moved on)."""

WINDOW_SECONDS = 0.1
"""How old a process's view of the ring's window may be when it claims."""

_WINDOW_FRESH = 0.005
"""A claim that comes up short reads the window again when it is older than this."""

UPKEEP_SECONDS = 0.2
"""How often each worker offers to take the ring's upkeep turn."""

QUEUE_LOOK_SECONDS = 0.05
"""After a claim found ``deliveries`` holding no more work placed before the ring's next row, the
next claims of the subscription look there again after this long (or when the ring runs dry): a
retry or a spilled row waits this much longer at most."""

LOCK_TIMEOUT = "10ms"
"""How long a prune waits for a slot's partitions before leaving them to the next turn."""

LOG_DAYS_AHEAD = 2
"""Days of the outcome log made ahead of today."""

_DAYS_EVERY = 600.0
_LOOK_AT_FREE_EVERY = 2.0
_FORGET_EVERY = 60.0
_LEDGER_KEPT = 1000
_MOVE_LIMIT = 1_000_000
_HELD_MOST, _HELD_SECONDS = 100_000, 3600.0


@dataclass
class RingStats:
    """What this process's upkeep turns did (for tests and benchmarks)."""

    rotations: int = 0
    rotations_refused: int = 0
    closed: int = 0
    pruned: int = 0
    prune_lock_timeouts: int = 0
    moved: int = 0
    spilled: int = 0


@dataclass
class _Gen:
    gen: int
    slot: int
    first_id: int
    age: float
    closing: bool
    closing_for: float | None


async def generations(conn: Any, db: PgDb) -> list[_Gen]:
    """The ring's live generations, the newest first (see ``ring_window``)."""
    return [_Gen(*r) for r in await conn.fetch(db.q["ring_window"], RING_SLOTS)]


async def evict(conn: Any, db: PgDb, subscription_id: int) -> int:
    """Move the subscription's unclaimed ring rows into ``deliveries`` (see ``ring_evict``): before
    it becomes ordered or is removed, in the caller's transaction. Nothing without the ring."""
    if not db.append_only:
        return 0
    slots = [g.slot for g in await generations(conn, db)]
    return len(await conn.fetch(db.q["ring_evict"], slots, subscription_id, None))


async def drop_days(conn: Any, db: PgDb, older_than_seconds: float, most: int = 30) -> int:
    """Drop the outcome log's days that ended more than ``older_than_seconds`` ago (retention)."""
    return int(await conn.fetchval(db.q["ring_drop_days"], older_than_seconds, most))


async def to_queue(conn: Any, db: PgDb, ids: Sequence[int]) -> None:
    """Move the ring deliveries among ``ids`` into ``deliveries`` (open claims as processing under
    their lease, unclaimed rows as pending), in the caller's transaction: an operator's action by
    id (cancel, release, retry now) is then the same statement with or without the ring."""
    if not db.append_only or not ids:
        return
    slots = [g.slot for g in await generations(conn, db)]
    await conn.fetch(db.q["ring_move"], slots, list(ids), None, None, False, len(ids))
    await conn.fetch(db.q["ring_evict"], slots, None, list(ids))


@dataclass
class PgRing:
    """The ring's statements, this process's ring claims, and the upkeep turn."""

    db: PgDb
    held: dict[DeliveryId, tuple[int, float, float]] = field(default_factory=dict)
    """The ring claims this process holds: delivery id -> (slot, monotonic time of the claim, lease)."""
    stats: RingStats = field(default_factory=RingStats)
    _window: list[int] = field(default_factory=list)
    _live: list[int] = field(default_factory=list)
    _window_at: float = -math.inf
    _days_at: float = -math.inf
    _free_at: float = -math.inf
    _forget_at: float = -math.inf
    _drained_at: dict[int, float] = field(default_factory=dict)
    _queue_next: dict[int, float] = field(default_factory=dict)

    # -- the claim's window ---------------------------------------------------

    async def claimable(self, conn: Any) -> list[int]:
        """The slots a claim may read: open and not closing (refreshed every :data:`WINDOW_SECONDS`)."""
        await self._refresh(conn)
        return self._window

    async def live(self, conn: Any, ids: Sequence[DeliveryId] = ()) -> list[int]:
        """Every slot not pruned yet (closing ones included): where open claims can be; with the
        slots of this process's claims among ``ids``, however recent."""
        await self._refresh(conn)
        held = self.held
        return sorted({*self._live, *(held[i][0] for i in ids if i in held)})

    async def _refresh(self, conn: Any, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._window_at >= WINDOW_SECONDS:
            gens = await self._gens(conn)
            self._window = [g.slot for g in gens if not g.closing]
            self._live = [g.slot for g in gens]
            self._window_at = now

    async def _gens(self, conn: Any) -> list[_Gen]:
        return await generations(conn, self.db)

    # -- the hot path -----------------------------------------------------------

    async def claim(
        self,
        conn: Any,
        subscription_id: int,
        limit: int,
        lease_seconds: float,
        token: uuid.UUID,
        worker_id: uuid.UUID,
        after: int,
    ) -> list[asyncpg.Record]:
        """Claim up to ``limit`` ready rows after the delivery id ``after`` (see ``ring_claim``)."""
        if time.monotonic() - self._days_at >= _DAYS_EVERY:
            await self.make_days(conn)  # on the claim's connection: a pool may have only that one
        window = await self.claimable(conn)
        q, lease = self.db.q["ring_claim"], lease_seconds
        rows = list(await conn.fetch(q, window, subscription_id, after, limit, token, worker_id, lease))
        if len(rows) < limit and time.monotonic() - self._window_at >= _WINDOW_FRESH:
            # Short, on a window read a while ago: a slot opened since may hold the rest.
            await self._refresh(conn, force=True)
            newer = [s for s in self._window if s not in window]
            if newer:
                more = limit - len(rows)
                rows += await conn.fetch(q, newer, subscription_id, after, more, token, worker_id, lease)
        now = time.monotonic()
        if len(self.held) > _HELD_MOST:  # results never written (dropped): forget the oldest
            self.held = {i: h for i, h in self.held.items() if now - h[1] < _HELD_SECONDS}
        self.held.update({r[0]: (r[14], now, lease_seconds) for r in rows})  # r[0]: id, r[14]: slot
        return rows

    def queue_due(self, subscription_id: int) -> bool:
        """Whether a claim of the subscription looks in ``deliveries`` before the ring now."""
        return time.monotonic() >= self._queue_next.get(subscription_id, -math.inf)

    def queue_looked(self, subscription_id: int, *, found_all: bool) -> None:
        """A look took what it asked for (look again at once) or found no more (look later)."""
        self._queue_next[subscription_id] = -math.inf if found_all else time.monotonic() + QUEUE_LOOK_SECONDS

    async def claim_queue(self, conn: Any, args: tuple[Any, ...], after: int) -> list[asyncpg.Record]:
        """The claim from ``deliveries`` beside the ring (``ring_claim_queue``): ``args`` those of
        ``claim``, ``after`` the ring cursor."""
        window = await self.claimable(conn)
        return list(await conn.fetch(self.db.q["ring_claim_queue"], *args, window, after))

    async def waiting(self, conn: Any, subscription_id: int) -> bool:
        """Whether the subscription has a ring row no claim took (its next claim is due now)."""
        window = await self.claimable(conn)
        return bool(await conn.fetchval(self.db.q["ring_waiting"], window, subscription_id))

    async def move_lost(self, conn: Any, silent_seconds: float, host: str) -> None:
        """Move the ring claims of lost workers into ``deliveries`` (see ``ring_lost_candidates``),
        where the rescue then takes them back as any."""
        recent = await conn.fetch(self.db.q["ring_lost_candidates"], silent_seconds, host)
        lost = lost_workers(recent, silent_seconds, host)
        if lost:
            await self.move(conn, await self.live(conn), workers=list(lost))

    def split(self, ids: Sequence[DeliveryId]) -> tuple[list[DeliveryId], list[DeliveryId]]:
        """``ids`` as (ring claims this process holds, the others)."""
        held = self.held
        if not held:
            return [], list(ids)
        ring = [i for i in ids if i in held]
        if not ring:
            return [], list(ids)
        return ring, [i for i in ids if i not in held]

    def forget(self, ids: Sequence[DeliveryId]) -> None:
        """Ring claims settled (or refused): no longer this process's."""
        for i in ids:
            self.held.pop(i, None)

    def young(self, ids: Sequence[DeliveryId], lease_seconds: float) -> list[DeliveryId]:
        """The ring claims among ``ids`` that a renewal to ``lease_seconds`` need not touch yet:
        claimed for that lease less than a third of it ago (renewals come a third of a lease
        apart, so the next comes before the lease ends). A renewal to another lease (a pull
        consumer's ``extend(seconds)``) always counts."""
        now, held = time.monotonic(), self.held
        return [
            i
            for i in ids
            if i in held and held[i][2] == lease_seconds and now - held[i][1] < lease_seconds / 3
        ]

    async def still_held(self, conn: Any, ids: Sequence[DeliveryId], token: str) -> set[DeliveryId]:
        """Of this process's ring claims ``ids``, those still held under ``token`` (a read: an
        operator may have taken one back meanwhile)."""
        slots = sorted({self.held[i][0] for i in ids})
        rows = await conn.fetch(self.db.q["ring_held"], slots, list(ids), uuid.UUID(token))
        return {r[0] for r in rows}

    async def complete(self, conn: Any, ids: Sequence[DeliveryId], token: str) -> set[DeliveryId]:
        """Complete ring claims held under ``token``; the ids it took (the rest were moved or lost)."""
        return await self._complete(conn, sorted({self.held[i][0] for i in ids}), ids, token)

    async def move(
        self,
        conn: Any,
        slots: Sequence[int],
        *,
        ids: Sequence[DeliveryId] | None = None,
        token: str | None = None,
        workers: Sequence[str] | None = None,
        expired: bool = False,
        limit: int = _MOVE_LIMIT,
    ) -> int:
        """Move open ring claims into ``deliveries`` as processing rows (see ``ring_move``)."""
        if not slots:
            return 0
        rows = await conn.fetch(
            self.db.q["ring_move"],
            list(slots),
            None if ids is None else list(ids),
            None if token is None else uuid.UUID(token),
            None if workers is None else [uuid.UUID(w) for w in workers],
            expired,
            limit,
        )
        self.stats.moved += len(rows)
        return len(rows)

    async def complete_anywhere(self, conn: Any, ids: Sequence[DeliveryId], token: str) -> set[DeliveryId]:
        """Complete ring claims ``ids`` held under ``token`` whatever process claimed them (a pull
        consumer hands its ids and token on): looked up in every live slot."""
        return await self._complete(conn, await self.live(conn), ids, token)

    async def _complete(
        self, conn: Any, slots: Sequence[int], ids: Sequence[DeliveryId], token: str
    ) -> set[DeliveryId]:
        rows = await conn.fetch(self.db.q["ring_complete"], list(slots), list(ids), uuid.UUID(token))
        return {r[0] for r in rows}

    async def move_ids(self, conn: Any, ids: Sequence[DeliveryId], token: str) -> None:
        """Move the ring claims among ``ids`` held under ``token`` into ``deliveries`` (before a
        failure, a release or a renewal is written there), whatever process claimed them."""
        await self.move(conn, await self.live(conn, ids), ids=ids, token=token)
        self.forget(ids)

    # -- upkeep -------------------------------------------------------------------

    async def upkeep(self) -> None:
        """One upkeep turn, if no other process is taking one (see the module's docstring)."""
        q = self.db.q
        closing: list[_Gen] = []
        if time.monotonic() - self._days_at >= _DAYS_EVERY:
            await self.make_days()
        async with self.db.tx("ring upkeep") as conn:
            if not await conn.fetchval(q["ring_leader"], self.db.schema):
                return
            now = time.monotonic()
            gens = await self._gens(conn)
            await self._rotate(conn, gens)
            gens = await self._gens(conn)
            await self._close(conn, gens)
            closing = [g for g in await self._gens(conn) if g.closing]
            if now - self._forget_at >= _FORGET_EVERY:
                await conn.execute(q["ring_forget"], _LEDGER_KEPT)
                self._forget_at = now
        for g in reversed(closing):  # oldest first
            if g.closing_for is not None and g.closing_for >= SETTLE_SECONDS:
                await self._prune(g.slot, g.gen)
        if time.monotonic() - self._free_at >= _LOOK_AT_FREE_EVERY:
            await self._empty_free_slots()

    async def make_days(self, conn: Any = None) -> None:
        """The outcome log's partitions of today and the next :data:`LOG_DAYS_AHEAD` days: made by
        each process before its first ring claim (a completion needs its day) and then every
        ten minutes; on ``conn`` (not in a transaction) when given, else on a pooled one."""
        if conn is None:
            async with self.db.conn("ring days") as pooled:
                await self.make_days(pooled)
            return
        async with conn.transaction():
            await conn.execute(self.db.q["ring_days_lock"], self.db.schema)
            await conn.execute(self.db.q["ring_make_days"], LOG_DAYS_AHEAD)
        self._days_at = time.monotonic()

    async def _rotate(self, conn: Any, gens: list[_Gen]) -> None:
        current = gens[0]
        fill = int(await conn.fetchval(self.db.q["ring_next_id"])) - current.first_id
        if not (fill >= SLOT_ROWS or (fill > 0 and current.age >= SLOT_SECONDS)):
            return
        nxt = current.gen + 1
        if nxt % RING_SLOTS in {g.slot for g in gens}:
            self.stats.rotations_refused += 1  # the ring is full: the oldest slot closes (_close)
            return
        await conn.execute(self.db.q["ring_mark"], nxt, nxt % RING_SLOTS, "open")
        await conn.execute(self.db.q["ring_analyze_slot"], current.slot)
        self.stats.rotations += 1

    async def _close(self, conn: Any, gens: list[_Gen]) -> None:
        self._drained_at = {gen: at for gen, at in self._drained_at.items() if gen in {g.gen for g in gens}}
        sealed = [g for g in reversed(gens[1:]) if not g.closing]  # oldest first
        full = len(gens) >= RING_SLOTS
        now = time.monotonic()
        # how long each generation has been sealed: since the next one opened
        sealed_for = {gens[k + 1].gen: gens[k].age for k in range(len(gens) - 1)}
        for i, g in enumerate(sealed):
            close = sealed_for[g.gen] >= MAX_AGE_SECONDS or (full and i == 0)
            if not close and now - self._drained_at.get(g.gen, -math.inf) >= SETTLE_SECONDS:
                self._drained_at[g.gen] = now
                close = not await conn.fetchval(self.db.q["ring_unclaimed"], g.slot)
            if close:
                await conn.execute(self.db.q["ring_mark"], g.gen, g.slot, "closing")
                self._drained_at.pop(g.gen, None)
                self.stats.closed += 1

    async def _prune(self, slot: int, gen: int | None) -> bool:
        """Empty ``slot``: its open claims and unclaimed rows into ``deliveries``, then TRUNCATE."""
        q = self.db.q
        try:
            async with self.db.tx("ring prune") as conn:
                if not await conn.fetchval(q["ring_leader"], self.db.schema):
                    return False
                if gen is None and slot in {g.slot for g in await self._gens(conn)}:
                    return False  # opened again since it was seen free
                await conn.execute(q["ring_lock_timeout"], LOCK_TIMEOUT)
                await conn.execute(q["ring_lock_slot"], slot)
                await self.move(conn, [slot])
                spilled = await conn.fetchrow(q["ring_spill"], slot, self.db.channel)
                await conn.execute(q["ring_truncate_slot"], slot)
                if gen is not None:
                    await conn.execute(q["ring_mark"], gen, slot, "pruned")
        except BackendError as exc:
            if not isinstance(exc.__cause__, asyncpg.exceptions.LockNotAvailableError):
                raise
            self.stats.prune_lock_timeouts += 1  # a claim or a result holds the slot: next turn
            return False
        self.stats.spilled += int(spilled["spilled"])
        if gen is not None:
            self.stats.pruned += 1
        return True

    async def _empty_free_slots(self) -> None:
        """A slot already pruned that holds a row again: a publish that read the ring's state before
        the slot closed and inserted after it was emptied. Its rows leave the ring the same way."""
        self._free_at = time.monotonic()
        async with self.db.conn("ring upkeep") as conn:
            live = {g.slot for g in await self._gens(conn)}
            free = [k for k in range(RING_SLOTS) if k not in live]
            stray = [k for k in free if await conn.fetchval(self.db.q["ring_holds_rows"], k)]
        for k in stray:
            await self._prune(k, None)
