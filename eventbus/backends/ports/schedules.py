"""Schedules, their occurrences, and the pure planner a tick applies."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Literal, Protocol

import msgspec

from ...types import OccurrenceInfo, OccurrenceStatus, ScheduleInfo, TickReport
from .delivery import OutgoingEvent

__all__ = ["PlannedOccurrence", "ScheduleDecl", "SchedulePlanner", "ScheduleStore", "TickPlan"]


class ScheduleDecl(msgspec.Struct, frozen=True):
    """A schedule as the code declares it: what it fires, when, and its policies."""

    name: str
    target_kind: Literal["event", "machine"]
    target: str
    cron: str | None
    every_seconds: float | None
    anchor: datetime
    timezone: str
    missed: str
    max_catchup: int
    overlap: str
    cooldown_seconds: float
    jitter_seconds: float
    dst_gap: str
    dst_fold: str

    def same_times(self, row: ScheduleInfo) -> bool:
        """Whether ``row`` stores the same occurrence times (spec, zone and DST policy)."""
        return (self.cron, self.every_seconds, self.anchor, self.timezone, self.dst_gap, self.dst_fold) == (
            row.cron,
            row.every_seconds,
            row.anchor,
            row.timezone,
            row.dst_gap,
            row.dst_fold,
        )


class PlannedOccurrence(msgspec.Struct, frozen=True):
    """One occurrence a tick records or moves on.

    ``existing`` rows (requested or buffered ones) are updated, guarded by
    their status; new ones are inserted. ``work`` is the event a fired
    occurrence publishes, in the same transaction.
    """

    scheduled_for: datetime
    status: OccurrenceStatus
    work: OutgoingEvent | None = None
    existing: bool = False


class TickPlan(msgspec.Struct, frozen=True):
    """What one tick does to one schedule, decided from its row and the database time.

    ``failed``: the schedule could not be planned (logged); nothing is
    recorded, requested occurrences keep waiting, and it is looked at again
    at ``next_run_at``.
    """

    occurrences: Sequence[PlannedOccurrence]
    next_occurrence_at: datetime
    next_run_at: datetime
    buffered_for: datetime | None
    failed: bool = False


class SchedulePlanner(Protocol):
    """The schedule logic a backend calls inside its tick transaction (synchronous, pure).

    It never touches the database: the backend hands it the row it locked,
    the database time and what it found, and applies the plan it returns.
    """

    def names(self) -> Sequence[str]:
        """The schedules this process can fire (the others are left alone), sorted."""
        ...

    @property
    def set_id(self) -> str:
        """A digest of :meth:`names`: the set recorded by ``declare`` that ticks claim from."""
        ...

    def first_occurrence(self, decl: ScheduleDecl, start: datetime) -> datetime:
        """The first occurrence time (of any fate) at or after ``start``."""
        ...

    def plan(self, row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        """Decide the tick of ``row`` at database time ``now``; never raises (see ``TickPlan.failed``).

        ``row.last_finished_at`` is already brought up to date; ``requested``
        are the times of triggered or backfilled occurrences waiting to fire.
        """
        ...


class ScheduleStore(Protocol):
    """Schedules and their occurrences.

    Guarantees: an occurrence is one row per (schedule, scheduled_for), so it
    is recorded, and fired, at most once; a tick locks the schedules it
    claims (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on
    SQLite) and records their occurrences, publishes their events (with the key
    ``name@scheduled_for``) and advances them in one transaction, on the
    database clock; a crash anywhere before the commit leaves nothing behind.
    "Finished" means every delivery of the fired event is terminal.
    """

    async def declare(self, decls: Sequence[ScheduleDecl], planner: SchedulePlanner) -> None:
        """Create new schedules and update changed ones; recorded occurrences stay.

        Also records ``planner.set_id`` with its names, the set a tick claims from.

        A changed spec restarts the times at the first new occurrence at or
        after the old ``next_occurrence_at`` (so a window still due stays due).
        """
        ...

    async def tick(self, planner: SchedulePlanner, limit: int) -> TickReport:
        """Claim up to ``limit`` due schedules of ``planner.set_id`` and apply their plans.

        Cost grows with the schedules due, not with those declared.
        """
        ...

    async def find(self, name: str | None = None) -> list[ScheduleInfo]:
        """Every recorded schedule by name, or the one named (empty when unknown)."""
        ...

    async def occurrences(self, name: str, limit: int) -> builtins.list[OccurrenceInfo]:
        """The newest ``limit`` occurrences of a schedule, newest first, with finish times."""
        ...

    async def pause(self, name: str, paused: bool) -> bool:
        """Pause or resume; False when no such schedule exists."""
        ...

    async def remove(self, name: str) -> bool:
        """Delete a schedule and its occurrence rows; False when it did not exist."""
        ...

    async def request(self, name: str, times: Sequence[datetime] | None) -> builtins.list[datetime]:
        """Ask for occurrences to fire at the next tick, whatever the policies.

        ``None`` means one occurrence at the database's now (a trigger). Times
        already fired (or waiting) are left alone; skipped ones are requested
        again. Returns the times requested.
        """
        ...
