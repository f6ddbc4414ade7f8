"""Retention: how long finished rows stay, and what is never deleted.

A :class:`Retention` on the :class:`~eventbus.Bus` is applied by workers (one
pruner at a time: an advisory lock on PostgreSQL, the file's write lock on
SQLite) and by ``eventbus prune``. Each pass deletes in small batches, each
in its own short transaction:

- a completed or cancelled delivery once it finished ``completed_retention``
  ago, with its attempt history;
- a dead delivery once it died ``dead_retention`` ago, with its history;
- an event once it is older than ``completed_retention``, no delivery of it
  remains (so no pending, processing or dead delivery ever loses its event),
  and, if it has a key, it is older than ``dedup_window``. On PostgreSQL the
  log is cut in chunks of ids (one a day by default, ``event_chunk_seconds``)
  and events go a chunk at a time, by dropping the chunk's table: when it
  closed ``completed_retention`` ago, the few events of it that must stay
  (at most ``batch_size * max_batches``) move out under their ids and the
  rest go with the table (when more than a thousand stay, the chunk's table
  is first swapped for a copy of them); a chunk with more waits. Event ids keep increasing but jump at the
  start of each chunk;
- a schedule occurrence (fired or skipped) once its time is
  ``occurrence_retention`` past; requested and buffered ones wait to fire
  and stay;
- a finished workflow instance (completed, failed or cancelled) once it
  finished ``workflow_retention`` ago, with its history, signals, effects and
  approvals; running, waiting, paused and uncertain instances stay whole;
- an audit trail row once it was recorded ``audit_retention`` ago;
- a throughput rollup row (:mod:`eventbus.throughput`) once its minute is
  ``rollup_retention`` ago.

Idempotency keys therefore hold for at least ``dedup_window`` (and as long as
the event is kept): a key published again after its event was pruned is a
new event. A backfill of a schedule's window older than ``occurrence_retention``
fires those occurrences again, as their records are gone; a workflow started
again after its instance was pruned begins as run 1.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import msgspec

from .backends.base import OccurrenceBatch, RetentionStore, WorkflowBatch
from .backends.ports import AuditBatch, RollupBatch
from .errors import ConfigurationError

__all__ = ["PruneReport", "Pruner", "Retention", "RetentionOverride"]

_Batch = TypeVar("_Batch", OccurrenceBatch, WorkflowBatch, AuditBatch, RollupBatch)


class RetentionOverride(msgspec.Struct, frozen=True):
    """One subscription's own retention; a setting left out is the bus's (``None`` keeps forever)."""

    completed_retention: timedelta | msgspec.UnsetType | None = msgspec.UNSET
    dead_retention: timedelta | msgspec.UnsetType | None = msgspec.UNSET


class Retention(msgspec.Struct, frozen=True):
    """Retention settings of a bus (``None`` for a setting keeps those rows forever).

    :param completed_retention: keep completed and cancelled deliveries, and
        events, this long after they finished.
    :param dead_retention: keep dead deliveries (and their history) this long.
    :param dedup_window: never delete a keyed event younger than this.
    :param interval: how often a worker runs a pass (``None``: workers never prune).
    :param batch_size: rows per delete statement (one short transaction each).
    :param max_batches: batches per pass, so a pass is bounded.
    :param per_subscription: :class:`RetentionOverride` by subscription name,
        e.g. an audit subscription that keeps its completed deliveries longer.
        Events follow ``completed_retention`` and are kept while any delivery is.
    :param occurrence_retention: keep a schedule's fired and skipped
        occurrences this long after their time (requested and buffered ones
        are kept until they fire).
    :param workflow_retention: keep a finished (completed, failed or cancelled)
        workflow instance, with its history, signals, effects and approvals,
        this long after it finished.
    :param audit_retention: keep the audit trail's rows (:mod:`eventbus.audit`) this long.
    :param rollup_retention: keep the throughput rollup the charts read
        (:mod:`eventbus.throughput`) this long: at least a day for the day's charts.
    :param event_chunk_seconds: on PostgreSQL, how long a chunk of the event
        log takes new events (at most ``completed_retention``): the grain in
        which events go. A chunk also closes when 90% of its ids are drawn.
    :param event_chunk_ids: on PostgreSQL, the ids of each new chunk.
    """

    completed_retention: timedelta | None = timedelta(days=7)
    dead_retention: timedelta | None = timedelta(days=30)
    dedup_window: timedelta = timedelta(days=7)
    interval: timedelta | None = timedelta(minutes=5)
    batch_size: int = 1000
    max_batches: int = 100
    per_subscription: dict[str, RetentionOverride] = {}
    occurrence_retention: timedelta | None = timedelta(days=7)
    workflow_retention: timedelta | None = timedelta(days=30)
    audit_retention: timedelta | None = timedelta(days=90)
    rollup_retention: timedelta | None = timedelta(days=2)
    event_chunk_seconds: float = 86400.0
    event_chunk_ids: int = 2**32

    def __post_init__(self) -> None:
        names = (
            "completed_retention", "dead_retention", "occurrence_retention", "workflow_retention",
            "audit_retention", "rollup_retention",
        )  # fmt: skip
        values = [(name, getattr(self, name)) for name in names]
        values += [("dedup_window", self.dedup_window), ("interval", self.interval)]
        for sub, o in self.per_subscription.items():
            values += [(f"{sub}: completed_retention", o.completed_retention)]
            values += [(f"{sub}: dead_retention", o.dead_retention)]
        for name, value in values:
            if isinstance(value, timedelta) and value < timedelta(0):
                raise ConfigurationError(f"Retention.{name} cannot be negative")
        if self.batch_size < 1 or self.max_batches < 1:
            raise ConfigurationError("Retention.batch_size and max_batches must be at least 1")
        if self.event_chunk_seconds < 0:
            raise ConfigurationError("Retention.event_chunk_seconds cannot be negative")
        if not 100 <= self.event_chunk_ids <= 2**52:
            raise ConfigurationError("Retention.event_chunk_ids must be between 100 and 2**52")


class PruneReport(msgspec.Struct):
    """What one pruning pass deleted (or, on a dry run, would delete)."""

    completed_deliveries: int = 0
    dead_deliveries: int = 0
    attempts: int = 0
    events: int = 0
    event_chunks: int = 0
    """Chunks of the event log dropped (PostgreSQL), their events counted in ``events``."""
    event_chunks_compacted: int = 0
    """Chunks of the event log compacted in place (PostgreSQL: many of their events must stay),
    the events that went counted in ``events``."""
    occurrences: int = 0
    """Schedule occurrences."""
    workflows: int = 0
    """Finished workflow instances."""
    workflow_rows: int = 0
    """The history, signals, effects and approvals of those instances."""
    audit_rows: int = 0
    """Rows of the audit trail."""
    rollup_rows: int = 0
    """Rows of the throughput rollup."""
    batches: int = 0
    dry_run: bool = False
    skipped: str | None = None
    """Why nothing ran, e.g. another pruner holds the lock."""
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return (
            self.completed_deliveries + self.dead_deliveries + self.events + self.occurrences + self.workflows
            + self.audit_rows + self.rollup_rows
        )  # fmt: skip


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _overrides(r: Retention) -> list[tuple[str, float | None, float | None]]:
    """(name, completed seconds, dead seconds) per overridden subscription, the bus's where unset."""
    out = []
    for name, o in sorted(r.per_subscription.items()):
        completed = r.completed_retention if o.completed_retention is msgspec.UNSET else o.completed_retention
        dead = r.dead_retention if o.dead_retention is msgspec.UNSET else o.dead_retention
        out.append((name, _seconds(completed), _seconds(dead)))
    return out


class Pruner:
    """Walks the log by id in batches, resuming where the last pass stopped.

    The walk starts over from the oldest event whenever it reaches events
    younger than every cutoff (or the end of the log), so rows kept longer
    (a backlog, retained dead letters) are stepped over, never rescanned on
    every pass.
    """

    def __init__(self, store: RetentionStore, retention: Retention) -> None:
        self.store = store
        self.retention = retention
        self.cursor = 0

    async def run(
        self,
        *,
        dry_run: bool = False,
        max_batches: int | None = None,
        progress: Callable[[PruneReport], object] | None = None,
    ) -> PruneReport:
        """One pass (at most ``max_batches``, default the retention's); skipped if another pruner runs."""
        started = time.monotonic()
        report = PruneReport(dry_run=dry_run)
        async with self.store.lock() as held:
            if not held:
                report.skipped = "another pruner holds the lock"
                return report
            budget = max_batches or self.retention.max_batches
            await self._walk(report, dry_run, budget, progress)
            await self._chunks(report, dry_run)
            # Past schedule occurrences, finished workflow instances with what
            # they left, the audit trail and the throughput rollup.
            r, store, walk = self.retention, self.store, self._walk_table
            args = (report, dry_run, budget, progress)
            await walk(r.occurrence_retention, store.prune_occurrences, _count_occurrences, *args)
            await walk(r.workflow_retention, store.prune_workflows, _count_workflows, *args)
            await walk(r.audit_retention, store.prune_audit, _count_audit, *args)
            await walk(r.rollup_retention, store.prune_rollup, _count_rollup, *args)
            report.seconds = time.monotonic() - started
            if not dry_run:
                await self.store.record_prune(msgspec.to_builtins(report))
        return report

    async def _walk(
        self,
        report: PruneReport,
        dry_run: bool,
        max_batches: int,
        progress: Callable[[PruneReport], object] | None,
    ) -> None:
        r = self.retention
        cursor = 0 if dry_run else self.cursor
        overrides = _overrides(r)
        for _ in range(max_batches):
            with anyio.CancelScope(shield=True):  # a batch is short: finish it rather than abort it
                batch = await self.store.prune_batch(
                    cursor,
                    r.batch_size,
                    completed_seconds=_seconds(r.completed_retention),
                    dead_seconds=_seconds(r.dead_retention),
                    dedup_seconds=r.dedup_window.total_seconds(),
                    dry_run=dry_run,
                    overrides=overrides,
                )
            await anyio.lowlevel.checkpoint()  # a cancel (a worker's stop) ends the walk between batches
            report.batches += 1
            report.completed_deliveries += batch.completed
            report.dead_deliveries += batch.dead
            report.attempts += batch.attempts
            report.events += batch.events
            if progress is not None:
                progress(report)
            if batch.last_event_id is None or batch.young:
                cursor = 0
                break
            cursor = batch.last_event_id
        if not dry_run:
            self.cursor = cursor

    async def _chunks(self, report: PruneReport, dry_run: bool) -> None:
        """Drop the chunks of the event log past retention (PostgreSQL; see ``prune_chunks``)."""
        r = self.retention
        with anyio.CancelScope(shield=True):  # each chunk is one short transaction
            done = await self.store.prune_chunks(
                completed_seconds=_seconds(r.completed_retention),
                dead_seconds=_seconds(r.dead_retention),
                dedup_seconds=r.dedup_window.total_seconds(),
                chunk_seconds=r.event_chunk_seconds,
                chunk_ids=r.event_chunk_ids,
                max_survivors=r.batch_size * r.max_batches,
                dry_run=dry_run,
                overrides=_overrides(r),
            )
        report.events += done.events
        report.event_chunks += done.chunks
        report.event_chunks_compacted += done.compacted

    async def _walk_table(
        self,
        keep: timedelta | None,
        prune: Callable[..., Awaitable[_Batch]],
        count: Callable[[PruneReport, _Batch], None],
        report: PruneReport,
        dry_run: bool,
        max_batches: int,
        progress: Callable[[PruneReport], object] | None,
    ) -> None:
        """Rows past their retention ``keep`` (None keeps them), oldest first, from the oldest each pass."""
        seconds = _seconds(keep)
        if seconds is None:
            return

        async def batch(after: Any) -> _Batch:
            return await prune(after, self.retention.batch_size, older_than_seconds=seconds, dry_run=dry_run)

        await _walk_rows(batch, lambda b: count(report, b), report, max_batches, progress)


def _count_occurrences(report: PruneReport, b: OccurrenceBatch) -> None:
    report.occurrences += b.occurrences


def _count_workflows(report: PruneReport, b: WorkflowBatch) -> None:
    report.workflows += b.instances
    report.workflow_rows += b.rows


def _count_audit(report: PruneReport, b: AuditBatch) -> None:
    report.audit_rows += b.rows


def _count_rollup(report: PruneReport, b: RollupBatch) -> None:
    report.rollup_rows += b.rows


async def _walk_rows(
    batch: Callable[[Any], Awaitable[_Batch]],
    count: Callable[[_Batch], None],
    report: PruneReport,
    max_batches: int,
    progress: Callable[[PruneReport], object] | None,
) -> None:
    """Run ``batch`` from the start until the end of its walk, at most ``max_batches`` times."""
    after: Any = None
    for _ in range(max_batches):
        with anyio.CancelScope(shield=True):  # a batch is short: finish it rather than abort it
            done = await batch(after)
        await anyio.lowlevel.checkpoint()  # a cancel ends the walk between batches
        report.batches += 1
        count(done)
        if progress is not None:
            progress(report)
        if done.last is None:
            return
        after = done.last
