"""``bus.schedules``: the schedules a bus declares, recorded and operated in the database."""

from __future__ import annotations

import builtins
from datetime import datetime

from .backends.base import ScheduleStore
from .errors import InvalidSchedule, UnknownSchedule
from .schedules import Planner, Schedule, backfill_times
from .types import OccurrenceInfo, ScheduleInfo, TickReport

__all__ = ["Schedules"]


def _unknown(name: str) -> UnknownSchedule:
    return UnknownSchedule(f"no schedule named {name!r} is recorded")


class Schedules:
    """The schedules of a bus: ``bus.schedules.pause(name)``, ``.trigger(name)``, ``.list()``.

    ``declared`` holds the schedules this code declares (``@bus.schedule``,
    routers included); the database holds every recorded one, declared here or
    by another application on the same schema.
    """

    def __init__(self, store: ScheduleStore, declared: dict[str, Schedule]) -> None:
        self.store = store
        self.declared = declared
        """The schedules this code declares, by name (shared with the bus)."""

    def planner(self) -> Planner:
        """The tick's logic for the schedules this bus declares."""
        return Planner(self.declared)

    async def declare(self, planner: Planner | None = None) -> None:
        """Record the declared schedules (create or update); a worker does this when it starts."""
        decls = [s.decl() for s in self.declared.values()]
        await self.store.declare(decls, planner or self.planner())

    async def tick(self, limit: int = 100, planner: Planner | None = None) -> TickReport:
        """Fire what is due of the declared schedules (up to ``limit`` schedules), as a worker does."""
        return await self.store.tick(planner or self.planner(), limit)

    async def list(self) -> builtins.list[ScheduleInfo]:
        """Every recorded schedule (declared by this code or not), by name."""
        return await self.store.find()

    async def info(self, name: str) -> ScheduleInfo:
        """One recorded schedule; :class:`UnknownSchedule` if there is none of that name."""
        found = await self.store.find(name)
        if not found:
            raise _unknown(name)
        return found[0]

    async def occurrences(self, name: str, limit: int = 20) -> builtins.list[OccurrenceInfo]:
        """The newest occurrences of a schedule with their fate, newest first."""
        await self.info(name)
        return await self.store.occurrences(name, limit)

    async def pause(self, name: str) -> None:
        """Stop firing (occurrences falling due meanwhile count as missed on resume)."""
        if not await self.store.pause(name, True):
            raise _unknown(name)

    async def resume(self, name: str) -> None:
        """Fire again from the next occurrence; those missed while paused follow the ``missed`` policy."""
        if not await self.store.pause(name, False):
            raise _unknown(name)

    async def remove(self, name: str) -> None:
        """Delete a schedule and its occurrence history (a worker declaring it creates it anew)."""
        if not await self.store.remove(name):
            raise _unknown(name)

    async def trigger(self, name: str) -> datetime:
        """Fire once now, with its own key (the database's now); a worker's next tick fires it."""
        await self.info(name)
        times = await self.store.request(name, None)
        if not times:
            raise _unknown(name)
        return times[0]

    async def backfill(self, name: str, start: datetime, end: datetime) -> builtins.list[datetime]:
        """Fire the occurrences of a past window, each at most once; return the times requested.

        Occurrences already fired or waiting are left alone, skipped ones fire
        now; the window stops before the schedule's next occurrence. A window
        of more than :data:`~eventbus.schedules.MAX_BACKFILL` occurrences is
        refused with :class:`InvalidSchedule` (nothing is requested).
        """
        if start.tzinfo is None or end.tzinfo is None or start > end:
            raise InvalidSchedule("backfill needs timezone-aware times with start <= end")
        row = await self.info(name)
        times = backfill_times(row, start, end, row.next_occurrence_at)
        if not times:
            return []
        return await self.store.request(name, times)
