"""Deleting what retention no longer keeps."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

__all__ = ["PruneBatch", "RetentionStore"]


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


class RetentionStore(Protocol):
    """Deleting finished rows past their retention, in small batches.

    Guarantees, on every backend:

    - a pending or processing delivery is never deleted, nor is a dead one
      younger than ``dead_seconds``, nor a completed or cancelled one that
      finished less than ``completed_seconds`` ago (or its subscription's
      override of either); ``None`` keeps that kind of row forever;
    - an event is deleted only once no delivery of it is left, it is older
      than ``completed_seconds``, and (when keyed) older than
      ``dedup_seconds``: its key is honoured at least that long;
    - each batch is one short transaction that waits for no row lock (rows
      held by another transaction are left for the next pass) and reads a
      bounded range of the log by primary key;
    - at most one pruner holds :meth:`lock` per database (an advisory
      lock on PostgreSQL; on SQLite the file's write lock serialises batches).
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

    async def record_prune(self, report: dict[str, Any]) -> None:
        """Note that a pass ran (``status`` shows when), with its summary."""
        ...
