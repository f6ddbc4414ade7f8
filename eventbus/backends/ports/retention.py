"""Deleting what retention no longer keeps."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

__all__ = [
    "AuditBatch",
    "ChunkPass",
    "OccurrenceBatch",
    "PruneBatch",
    "RetentionStore",
    "RollupBatch",
    "WorkflowBatch",
]


class PruneBatch(msgspec.Struct, frozen=True):
    """What one batch of the retention walk deleted (or would delete, on a dry run)."""

    last_event_id: int | None
    """Where the walk goes on from; None when it reached the end of the log."""
    young: bool
    """The batch reached events younger than every cutoff: nothing further can go yet."""
    completed: int = 0
    dead: int = 0
    attempts: int = 0
    events: int = 0


class OccurrenceBatch(msgspec.Struct, frozen=True):
    """What one batch of the walk over past schedule occurrences deleted (or would delete)."""

    last: Any
    """Where the walk goes on from (an opaque cursor); None when it reached the end."""
    occurrences: int = 0


class AuditBatch(msgspec.Struct, frozen=True):
    """What one batch of the walk over old audit rows deleted (or would delete)."""

    last: Any
    """Where the walk goes on from (an opaque cursor); None when it reached the end."""
    rows: int = 0


class RollupBatch(msgspec.Struct, frozen=True):
    """What one batch of the walk over old throughput rollup rows deleted (or would delete)."""

    last: Any
    """Where the walk goes on from (an opaque cursor); None when it reached the end."""
    rows: int = 0


class WorkflowBatch(msgspec.Struct, frozen=True):
    """What one batch of the walk over finished workflow instances deleted (or would delete)."""

    last: Any
    """Where the walk goes on from (an opaque cursor); None when it reached the end."""
    instances: int = 0
    rows: int = 0
    """Their history, signals, effects and approvals."""


class ChunkPass(msgspec.Struct, frozen=True):
    """What one pass over the chunks of the event log did (PostgreSQL; nothing on SQLite)."""

    events: int = 0
    """Events that went with their chunks, dropped or compacted (those kept are not counted)."""
    chunks: int = 0
    """Chunks dropped (or, on a dry run, that would be)."""
    pinned: int = 0
    """Chunks past retention kept whole: more events of theirs must stay than a pass moves (or
    than a drop moves under its lock, and compacting would free less than half of the chunk)."""
    busy: int = 0
    """Chunks whose lock was not granted at once: tried again next pass."""
    compacted: int = 0
    """Chunks compacted in place (their events that go counted in ``events``), dropped later."""


class RetentionStore(Protocol):
    """Deleting finished rows past their retention, in small batches.

    Guarantees, on every backend:

    - a pending or processing delivery is never deleted, nor is a dead one
      younger than ``dead_seconds``, nor a completed or cancelled one that
      finished less than ``completed_seconds`` ago (or its subscription's
      override of either); ``None`` keeps that kind of row forever;
    - an event is deleted only once no delivery of it is left, it is older
      than ``completed_seconds``, and (when keyed) older than
      ``dedup_seconds``: its key is honoured at least that long (on
      PostgreSQL events go with their chunk, see :meth:`prune_chunks`, so an
      event may stay until the rest of its chunk can go);
    - each batch is one short transaction that waits for no row lock (rows
      held by another transaction are left for the next pass) and reads a
      bounded range of the log by primary key;
    - at most one pruner holds :meth:`lock` per database (an advisory
      lock on PostgreSQL; on SQLite the file's write lock serialises batches);
    - a schedule occurrence is deleted only once it is older than its
      cutoff (by its scheduled time) and not waiting to fire (requested or
      buffered ones stay);
    - a workflow instance is deleted only once it finished (completed,
      failed or cancelled) longer ago than its cutoff, and then with all its
      history, signals, effects and approvals in the same transaction, so a
      later start of the same key begins from nothing;
    - on PostgreSQL, no event is deleted while a transaction that backfills a
      new subscription is open (its deliveries are invisible until it commits).
    """

    def lock(self) -> contextlib.AbstractAsyncContextManager[bool]:
        """Try to become the one pruner; yields False (at once) when another is."""
        ...

    async def prune_batch(
        self,
        after_event_id: int,
        limit: int,
        *,
        completed_seconds: float | None,
        dead_seconds: float | None,
        dedup_seconds: float,
        dry_run: bool = False,
        overrides: Sequence[tuple[str, float | None, float | None]] = (),
    ) -> PruneBatch:
        """Prune among the ``limit`` events after ``after_event_id`` (by id); see the guarantees.

        ``overrides`` are (subscription name, completed seconds, dead seconds)
        used instead of the bus-wide cutoffs for that subscription's deliveries.
        """
        ...

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
        overrides: Sequence[tuple[str, float | None, float | None]] = (),
    ) -> ChunkPass:
        """Drop the chunks of the event log past retention, where the log has chunks.

        Closes the open chunk when it is older than ``chunk_seconds`` (or than
        ``completed_seconds``, if shorter) or nearly full, keeps the next
        ``chunk_ids`` ids ready, then drops each chunk closed longer ago than
        ``completed_seconds`` (None: never) whose events must nearly all go
        (by the guarantees above): the few that stay, at most
        ``max_survivors``, outlive the chunk under their ids, and a chunk with
        more is kept. A backend may compact a chunk instead (its table
        replaced by one holding only the events that stay; the others counted
        in ``events``, the chunk in ``compacted``) and drop it at a later pass. A
        lock not granted at once leaves a chunk to the next pass. The open
        chunk closes when due on a dry run too (closing deletes nothing). A
        backend whose log has no chunks (SQLite) deletes its events in
        :meth:`prune_batch` and does nothing here.
        """
        ...

    async def record_prune(self, report: dict[str, Any]) -> None:
        """Note that a pass ran (``status`` shows when), with its summary."""
        ...

    async def prune_occurrences(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> OccurrenceBatch:
        """Prune among the next ``limit`` occurrences scheduled before the cutoff, oldest first.

        ``after`` is the previous batch's ``last`` (None: from the oldest).
        """
        ...

    async def prune_workflows(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> WorkflowBatch:
        """Prune among the next ``limit`` instances finished before the cutoff, oldest first.

        ``after`` is the previous batch's ``last`` (None: from the oldest).
        """
        ...

    async def prune_audit(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> AuditBatch:
        """Prune among the next ``limit`` audit rows recorded before the cutoff, oldest first.

        ``after`` is the previous batch's ``last`` (None: from the oldest).
        """
        ...

    async def prune_rollup(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> RollupBatch:
        """Prune among the next ``limit`` throughput rollup rows of minutes before the cutoff, oldest first.

        ``after`` is the previous batch's ``last`` (None: from the oldest).
        """
        ...
