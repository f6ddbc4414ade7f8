"""The retention port on PostgreSQL: one pruner per schema, short batches that never wait on locks."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import asyncpg
import orjson

from ...errors import BackendError
from .._observe import Override, shortest_cutoff
from .._rows import row_as
from ..ports import AuditBatch, ChunkPass, OccurrenceBatch, PruneBatch, RollupBatch, WorkflowBatch
from ._db import PgDb
from .ring import drop_days

__all__ = ["PgRetention"]

_BUSY = (asyncpg.exceptions.LockNotAvailableError, asyncpg.exceptions.DeadlockDetectedError)

_BATCH_TRIES = 8
"""Tries of a retention batch whose lock wait timed out (about 5 s in all) before the pass fails."""

_KEY_BATCH = 10_000
"""Events read per transaction of the walk that deletes a closed chunk's keys."""

_LOG_LOCK_WAIT = "SET LOCAL lock_timeout = '50ms'"
"""The longest a chunk drop's request for the log's parent queues claims and publishes behind it."""

_LOG_LOCK_TRIES = 4
"""Tries of a chunk drop's request for the log's parent before the chunk waits for the next pass."""

_MOVE_LIMIT = 1000
"""Survivors a chunk's drop re-inserts (in events_kept) while it holds the log, which every
claim and publish waits for; a chunk with more is compacted (see ``compact_event_chunk``)."""

CHUNK_FILL = 0.9
"""A chunk this full closes whatever its age, so a publish never runs out of ids in it."""


class _Gone(Exception):
    """The chunk being dropped is no longer a closed chunk (its drop's transaction rolls back)."""


def _pinned(survivors: int, max_survivors: int, size: int | None) -> bool:
    """Whether a closed chunk with this many survivors (of ``size`` events) waits for a later
    pass: more than a pass moves, or too many to move under the log's lock and a compaction
    would free less than half of it (``size`` None: not known yet)."""
    if survivors > max_survivors:
        return True
    return size is not None and survivors > _MOVE_LIMIT and 2 * survivors > size


class PgRetention:
    """:class:`~eventbus.backends.ports.RetentionStore` on PostgreSQL (the guarantees are there)."""

    def __init__(self, db: PgDb) -> None:
        self.db = db
        self.q = db.q
        self._lock_conn: Any = None
        """The connection whose open transaction holds the lock (behind a transaction pooler)."""

    @contextlib.asynccontextmanager
    async def lock(self) -> AsyncIterator[bool]:
        """Try to become the one pruner (an advisory lock); yields False when another is."""
        locking = self._transaction_lock if self.db.transaction_pooler else self._session_lock
        async with locking() as held:
            yield held

    @contextlib.asynccontextmanager
    async def _session_lock(self) -> AsyncIterator[bool]:
        async with self.db.conn() as conn:
            held = bool(await conn.fetchval(self.q["prune_try_lock"], self.db.channel))
            try:
                yield held
            finally:
                if held:
                    # Shielded: a pooled connection must never keep the lock after a cancel.
                    with anyio.CancelScope(shield=True):
                        await conn.fetchval(self.q["prune_unlock"], self.db.channel)

    @contextlib.asynccontextmanager
    async def _transaction_lock(self) -> AsyncIterator[bool]:
        """Behind a transaction pooler: the lock in a transaction open for the pass.

        The transaction is idle between batches with no snapshot, so it holds
        back no vacuum; each batch touches it first (see ``prune_lock_touch``).
        """
        async with self.db.conn() as conn, conn.transaction():
            held = bool(await conn.fetchval(self.q["prune_try_xact_lock"], self.db.channel))
            self._lock_conn = conn if held else None
            try:
                yield held
            finally:
                self._lock_conn = None

    async def prune_batch(
        self,
        after_event_id: int,
        limit: int,
        *,
        completed_seconds: float | None,
        dead_seconds: float | None,
        dedup_seconds: float,
        dry_run: bool = False,
        overrides: Sequence[Override] = (),
    ) -> PruneBatch:
        """Prune among the ``limit`` events after ``after_event_id`` (see ``RetentionStore``)."""
        args = (
            after_event_id,
            limit,
            completed_seconds,
            dead_seconds,
            dedup_seconds,
            dry_run,
            [o[0] for o in overrides],
            [o[1] for o in overrides],
            [o[2] for o in overrides],
            shortest_cutoff(completed_seconds, dead_seconds, overrides),
        )
        await self._touch_lock()
        if self.db.append_only and after_event_id == 0 and completed_seconds is not None and not dry_run:
            await self._drop_days(completed_seconds)
        for attempt in range(_BATCH_TRIES):
            try:
                async with self.db.conn() as conn, conn.transaction():
                    # Never queue behind (or in front of) another lock holder for long.
                    await conn.execute("SET LOCAL lock_timeout = '200ms'")
                    events_may_go = await conn.fetchval(self.q["prune_backfill_guard"], self.db.channel)
                    row = await conn.fetchrow(self.q["prune_batch"], *args, events_may_go)
                break
            except BackendError as exc:
                # The batch reads the ring (its unsettled rows keep their events), whose upkeep
                # empties a slot under an ACCESS EXCLUSIVE lock for a moment: try again.
                if not isinstance(exc.__cause__, _BUSY) or attempt == _BATCH_TRIES - 1:
                    raise
                await anyio.sleep(min(0.05 * 2**attempt, 1.0))
        # ``young`` is NULL for an empty batch (the end of the log).
        return row_as(PruneBatch, row, last_event_id=row["last_id"], young=bool(row["young"]))

    async def _drop_days(self, completed_seconds: float) -> None:
        """The append-only ring's completed deliveries: whole days of the outcome log, by DROP
        TABLE (a day is dropped once it ended more than the completed retention ago). A drop
        that would wait for a reader is left to the next pass."""
        try:
            async with self.db.conn() as conn, conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '200ms'")
                await drop_days(conn, self.db, completed_seconds)
        except BackendError as exc:
            if not isinstance(exc.__cause__, asyncpg.exceptions.LockNotAvailableError):
                raise

    async def prune_chunks(
        self,
        *,
        completed_seconds: float | None,
        dead_seconds: float | None,
        dedup_seconds: float,
        chunk_seconds: float,
        chunk_ids: int,
        max_survivors: int,
        dry_run: bool = False,
        overrides: Sequence[Override] = (),
    ) -> ChunkPass:
        """Close the open chunk when due, then drop the chunks past retention (see ``RetentionStore``).

        A chunk need not stay open longer than the retention of its events: it
        could not go before it closed.
        """
        max_age = chunk_seconds if completed_seconds is None else min(chunk_seconds, completed_seconds)
        await self._touch_lock()
        async with self.db.conn() as conn:
            with contextlib.suppress(*_BUSY):
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = '200ms'")
                    await conn.fetchval(self.q["rotate_chunks"], chunk_ids, max_age, CHUNK_FILL)
        if completed_seconds is None:
            return ChunkPass()
        async with self.db.conn() as conn:
            chunks = await conn.fetch(self.q["chunks_past"], completed_seconds)
        cutoffs = (completed_seconds, dead_seconds, dedup_seconds, max_survivors, dry_run, overrides)
        done = ChunkPass()
        for chunk in chunks:
            name, lo, hi, closed_at = chunk["name"], chunk["lo"], chunk["hi"], chunk["closed_at"]
            one = await self._drop_chunk(name, lo, hi, closed_at, *cutoffs)
            done = ChunkPass(
                events=done.events + one.events, chunks=done.chunks + one.chunks,
                pinned=done.pinned + one.pinned, busy=done.busy + one.busy,
                compacted=done.compacted + one.compacted,
            )  # fmt: skip
        return done

    async def _drop_chunk(
        self,
        name: str,
        lo: int,
        hi: int,
        closed_at: Any,
        completed_seconds: float,
        dead_seconds: float | None,
        dedup_seconds: float,
        max_survivors: int,
        dry_run: bool,
        overrides: Sequence[Override],
    ) -> ChunkPass:
        """One chunk: its keys that go, in batches; then, in one transaction, the drop.

        Every claim of the database locks the log's parent and then each
        chunk (a generic plan of the claim's join locks every partition before
        it prunes them), so the drop takes the parent first, in the claims'
        order (see ``lock_event_log``). It takes it last, for catalog work and
        at most :data:`_MOVE_LIMIT` rows: the survivors are read, and copied,
        before (see ``_survivors`` for why nothing read before can be stale).
        A chunk with more survivors is compacted (``compact_event_chunk``)
        when that frees at least half of it, else it waits like a pinned one.
        """
        await self._touch_lock()
        survivors = functools.partial(
            self._survivors, lo, hi, closed_at, dedup_seconds, dry_run, completed_seconds,
            dead_seconds, overrides, max_survivors,
        )  # fmt: skip
        async with self.db.conn() as conn:
            # A chunk that is pinned now waits for a later pass (keeping it is always safe),
            # told before the key walk, without the transaction's locks.
            # The chunk's size (a count of all its events) only decides for a chunk with more
            # survivors than a drop moves (see ``_pinned``).
            count = len(await survivors(conn))
            size = None
            if max_survivors >= count > _MOVE_LIMIT:
                size = await conn.fetchval(self.q["chunk_size"], lo, hi)
            if _pinned(count, max_survivors, size):
                return ChunkPass(pinned=1)
            try:  # no event arrives in the chunk from here (before its keys are walked)
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = '200ms'")
                    await conn.execute(self.q["fence_event_log"])
            except _BUSY:
                return ChunkPass(busy=1)
            size = await conn.fetchval(self.q["chunk_size"], lo, hi)  # with any event that was late
        if not dry_run:
            await self._forget_keys(lo, hi, dedup_seconds, min(max_survivors, _KEY_BATCH))
        async with self.db.conn() as conn:
            try:
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = '200ms'")
                    # As for prune_batch: no event goes while a backfill is open.
                    if not await conn.fetchval(self.q["prune_backfill_guard"], self.db.channel):
                        return ChunkPass(busy=1)
                    ids = [r["id"] for r in await survivors(conn)]
                    if _pinned(len(ids), max_survivors, size):
                        return ChunkPass(pinned=1)
                    if dry_run:
                        moved = len(ids) <= _MOVE_LIMIT  # else compacted
                        return ChunkPass(events=size - len(ids), chunks=int(moved), compacted=int(not moved))
                    return await self._drop_locked(conn, name, lo, hi, size, ids)
            except _BUSY:  # a lock not granted within lock_timeout: next pass
                return ChunkPass(busy=1)
            except _Gone:
                return ChunkPass()

    async def _drop_locked(
        self, conn: Any, name: str, lo: int, hi: int, size: int, ids: list[int]
    ) -> ChunkPass:
        """The drop's end, in its transaction: the survivors ``ids`` copied, then, under the
        log's lock, the chunk dropped and the copy put back in events_kept (a few survivors)
        or the chunk swapped for the copy (more: ``compact_event_chunk``)."""
        compact = len(ids) > _MOVE_LIMIT
        if compact:
            await conn.fetchval(self.q["compact_chunk"], name, ids)
        else:
            copy = await conn.fetchval(self.q["chunk_keep"], lo, hi, ids)
            kept = [tuple(e) for e in copy or ()]  # a row type's array takes tuples
        await self._lock_log(conn)
        if await conn.fetchrow(self.q["lock_chunk"], name) is None:  # no longer a closed chunk
            raise _Gone  # (and the transaction, with its copy, rolls back)
        if compact:
            await conn.execute(self.q["swap_chunk"], name)
            return ChunkPass(events=size - len(ids), compacted=1)
        await conn.fetchval(self.q["drop_chunk"], name)
        await conn.execute(self.q["chunk_kept_back"], kept)
        return ChunkPass(events=size - len(kept), chunks=1)

    async def _survivors(
        self,
        lo: int,
        hi: int,
        closed_at: Any,
        dedup_seconds: float,
        dry_run: bool,
        completed_seconds: float,
        dead_seconds: float | None,
        overrides: Sequence[Override],
        max_survivors: int,
        conn: Any,
    ) -> list[Any]:
        """The events of a closed chunk that must outlive it (at most ``max_survivors`` + 1).

        Read in the drop's transaction before the log's lock, they are still
        every survivor when the lock is granted: the chunk gets no new event
        (``fence_event_log`` ran before), and a delivery is inserted for an
        existing event only by a backfill, which the transaction holds off
        (``prune_backfill_guard``), or by the append-only ring moving one of
        its unsettled deliveries to ``deliveries``, whose event was read as a
        survivor already. Whatever changed meanwhile can only take a survivor
        away (a delivery settled or deleted, a key's window over): its event
        is kept longer, in ``events_kept`` where the walk finds it, or in the
        compacted chunk until its next pass.
        """
        return list(
            await conn.fetch(
                self.q["chunk_survivors"], lo, hi, closed_at, dedup_seconds, dry_run, completed_seconds,
                dead_seconds, [o[0] for o in overrides], [o[1] for o in overrides],
                [o[2] for o in overrides], max_survivors + 1,
            )
        )  # fmt: skip

    async def _lock_log(self, conn: Any) -> None:
        """Take the log's parent (``lock_event_log``), waiting at most :data:`_LOG_LOCK_WAIT`
        each try: claims and publishes queue behind a waiting request, so it gives up
        soon and tries again after they went through. The last try's error propagates
        (the transaction rolls back, a compaction's copy with it)."""
        for attempt in range(_LOG_LOCK_TRIES):
            try:
                async with conn.transaction():  # a savepoint: a timed-out try leaves the rest
                    await conn.execute(_LOG_LOCK_WAIT)
                    await conn.execute(self.q["lock_event_log"])
                    return
            except _BUSY:
                if attempt == _LOG_LOCK_TRIES - 1:
                    raise
                await anyio.sleep(0.02 * (attempt + 1))

    async def _forget_keys(self, lo: int, hi: int, dedup_seconds: float, batch: int) -> None:
        """Delete the keys of a closed chunk's events that will go with it, a batch per transaction."""
        after: int | None = lo - 1
        while after is not None:
            await self._touch_lock()
            async with self.db.conn() as conn:
                after = await conn.fetchval(self.q["chunk_forget_keys"], after, hi, batch, dedup_seconds)

    async def prune_occurrences(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> OccurrenceBatch:
        """Past schedule occurrences, oldest first (see ``RetentionStore``)."""
        at, name = after or (None, None)
        row = await self._batch(self.q["prune_occurrences"], at, name, limit, older_than_seconds, dry_run)
        last = (row["last_at"], row["last_name"]) if row["occurrences"] == limit else None
        return OccurrenceBatch(last=last, occurrences=row["occurrences"])

    async def prune_workflows(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> WorkflowBatch:
        """Finished workflow instances with their rows, oldest first (see ``RetentionStore``)."""
        at, machine, key = after or (None, None, None)
        row = await self._batch(
            self.q["prune_workflows"], at, machine, key, limit, older_than_seconds, dry_run
        )
        last = (row["last_at"], row["last_machine"], row["last_key"]) if row["instances"] == limit else None
        return WorkflowBatch(last=last, instances=row["instances"], rows=row["rows"])

    async def prune_audit(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> AuditBatch:
        """Audit rows past their retention, oldest first (see ``RetentionStore``)."""
        at, last_id = after or (None, None)
        row = await self._batch(self.q["prune_audit"], at, last_id, limit, older_than_seconds, dry_run)
        last = (row["last_at"], row["last_id"]) if row["rows"] == limit else None
        return AuditBatch(last=last, rows=row["rows"])

    async def prune_rollup(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> RollupBatch:
        """Throughput rollup rows past their retention, oldest first (see ``RetentionStore``)."""
        minute, last_id = after or (None, None)
        row = await self._batch(self.q["prune_rollup"], minute, last_id, limit, older_than_seconds, dry_run)
        last = (row["last_minute"], row["last_id"]) if row["rows"] == limit else None
        return RollupBatch(last=last, rows=row["rows"])

    async def _touch_lock(self) -> None:
        """Behind a transaction pooler, keep the lock's transaction from idling out (``prune_lock_touch``)."""
        if self._lock_conn is not None:
            await self._lock_conn.execute(self.q["prune_lock_touch"])

    async def _batch(self, sql: str, *args: Any) -> Any:
        """One batch statement in its own short transaction that never queues on a row lock for long."""
        await self._touch_lock()
        async with self.db.conn() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '200ms'")
            return await conn.fetchrow(sql, *args)

    async def record_prune(self, report: dict[str, Any]) -> None:
        """Note that a pass ran, with its summary (``status`` shows when)."""
        async with self.db.conn() as conn:
            await conn.execute(self.q["prune_record"], orjson.dumps(report).decode())
