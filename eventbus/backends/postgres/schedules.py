"""The schedule port on PostgreSQL: declare, tick, inspect, operate.

A tick is one transaction: ``FOR UPDATE SKIP LOCKED`` on up to ``limit`` due
schedules (so workers tick side by side without a leader and never the same
schedule at once), then for each: the finish of its last firing, the plan
from the planner, the events published, the occurrences recorded and the
schedule advanced. Everything commits together or not at all.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from ...errors import BackendError
from ...types import EventId, OccurrenceInfo, ScheduleInfo, TickReport
from .._rows import row_as, rows_as
from ..ports import OutgoingEvent, ScheduleDecl, SchedulePlanner, TickPlan
from ._db import PgDb

__all__ = ["PgSchedules"]

_REQUESTED_PER_TICK = 1000


def info_of(row: asyncpg.Record) -> ScheduleInfo:
    """A schedule row (``paused_at`` set or not) as the schedule it describes."""
    return row_as(ScheduleInfo, row, paused=row["paused_at"] is not None)


class PgSchedules:
    """:class:`~eventbus.backends.ports.ScheduleStore` on PostgreSQL (the guarantees are there)."""

    def __init__(self, db: PgDb) -> None:
        self.db = db
        self.q = db.q

    async def declare(self, decls: Sequence[ScheduleDecl], planner: SchedulePlanner) -> None:
        """Create new schedules and update changed ones in one statement (see ``ScheduleStore``)."""
        if not decls:
            return
        async with self.db.tx("declaring schedules") as conn:
            if await conn.fetchval(self.q["schedule_set_known"], planner.set_id) is None:
                await conn.execute(self.q["schedule_set_record"], planner.set_id, list(planner.names()))
            rows = await conn.fetch(self.q["schedule_rows_locked"], [d.name for d in decls])
            existing = {r["name"]: info_of(r) for r in rows}
            now = await conn.fetchval(self.q["schedule_now"])
            declared = [_declared(d, existing.get(d.name), now, planner) for d in sorted(decls, key=_name)]
            await conn.execute(self.q["schedule_declare"], *_columns(declared))

    async def tick(self, planner: SchedulePlanner, limit: int) -> TickReport:
        """Claim due schedules and apply their plans (see ``ScheduleStore.tick``).

        One transaction for the whole batch: a fixed number of statements, whatever its size.
        """
        fired = recorded = 0
        async with self.db.tx("a schedule tick") as conn:
            rows = await conn.fetch(self.q["schedule_claim"], planner.set_id, limit)
            if rows:
                infos = await self._note_finishes(conn, [info_of(r) for r in rows])
                requested = await self._requested(conn, [i.name for i in infos if i.requested])
                now = rows[0]["db_now"]
                plans = [
                    (i, planner.plan(i, now, requested.get(i.name, [])[:_REQUESTED_PER_TICK])) for i in infos
                ]
                await self._apply(conn, plans, requested)
                fired = sum(o.work is not None for _, p in plans for o in p.occurrences)
                recorded = sum(len(p.occurrences) for _, p in plans)
            due_in = await conn.fetchval(self.q["schedule_next_due"], planner.set_id)
        return TickReport(len(rows), fired, recorded, due_in, len(rows) == limit)

    async def _note_finishes(self, conn: Any, infos: list[ScheduleInfo]) -> list[ScheduleInfo]:
        """Bring ``last_finished_at`` up to date: the last firing's deliveries all terminal."""
        waiting = {
            i.last_event_id: i for i in infos if i.last_event_id is not None and i.last_finished_at is None
        }
        if not waiting:
            return infos
        work = {r["event_id"]: r for r in await conn.fetch(self.q["schedule_work_open"], list(waiting))}
        finished: dict[str, tuple[int, datetime]] = {}
        for event_id, info in waiting.items():
            row = work.get(event_id)
            if row is None or not row["open"]:
                last = row["last"] if row is not None else None
                finished[info.name] = (event_id, last or info.last_run_at or info.next_run_at)
        if finished:
            names = list(finished)
            await conn.execute(
                self.q["schedule_finished"],
                names,
                [finished[n][0] for n in names],
                [finished[n][1] for n in names],
            )
        return [
            msgspec.structs.replace(i, last_finished_at=finished[i.name][1]) if i.name in finished else i
            for i in infos
        ]

    async def _requested(self, conn: Any, names: list[str]) -> dict[str, list[datetime]]:
        found: dict[str, list[datetime]] = {}
        if names:
            for r in await conn.fetch(self.q["schedule_requested"], names, _REQUESTED_PER_TICK + 1):
                found.setdefault(r["schedule"], []).append(r["scheduled_for"])
        return found

    async def _apply(
        self, conn: Any, plans: list[tuple[ScheduleInfo, TickPlan]], requested: dict[str, list[datetime]]
    ) -> None:
        """Publish every fired occurrence's event, record every occurrence, advance every schedule."""
        works: list[OutgoingEvent] = [o.work for _, p in plans for o in p.occurrences if o.work is not None]
        results = await self.db.publish_on(conn, works) if works else []
        new, moved, advance = _writes(plans, iter(r.event_id for r in results), requested)
        if new:
            await conn.execute(self.q["occurrences_insert"], *_columns(new))
        if moved:
            await conn.execute(self.q["occurrences_fire"], *_columns(moved))
        advanced = await conn.fetch(self.q["schedule_advance"], *_columns(advance))
        if len(advanced) != len(plans):
            raise BackendError("a schedule moved while its tick held it")

    async def find(self, name: str | None = None) -> list[ScheduleInfo]:
        """Every recorded schedule by name, or the one named (empty when unknown)."""
        async with self.db.conn("listing schedules") as conn:
            rows = await conn.fetch(self.q["schedules_list"], name)
        return [info_of(r) for r in rows]

    async def occurrences(self, name: str, limit: int) -> builtins.list[OccurrenceInfo]:
        """The newest ``limit`` occurrences of a schedule, newest first, with finish times."""
        async with self.db.conn("listing occurrences") as conn:
            rows = await conn.fetch(self.q["occurrences_list"], name, limit)
        return rows_as(OccurrenceInfo, rows)

    async def pause(self, name: str, paused: bool) -> bool:
        """Pause or resume; False when no such schedule exists."""
        async with self.db.conn("pausing a schedule") as conn:
            return await conn.fetchval(self.q["schedule_pause"], name, paused) is not None

    async def remove(self, name: str) -> bool:
        """Delete a schedule and its occurrence rows; False when it did not exist."""
        async with self.db.conn("removing a schedule") as conn:
            return bool(await conn.fetchval(self.q["schedule_remove"], name))

    async def request(self, name: str, times: Sequence[datetime] | None) -> builtins.list[datetime]:
        """Ask for occurrences at the next tick (see ``ScheduleStore.request``); the times requested."""
        async with self.db.tx("requesting occurrences") as conn:
            now = await conn.fetchval(self.q["schedule_request"], name)
            if now is None:
                return []
            rows = await conn.fetch(
                self.q["occurrences_request"], name, [now] if times is None else list(times)
            )
        return [r["scheduled_for"] for r in rows]


def _name(decl: ScheduleDecl) -> str:
    return decl.name


def _declared(
    d: ScheduleDecl, old: ScheduleInfo | None, now: datetime, planner: SchedulePlanner
) -> tuple[Any, ...]:
    """One row of ``schedule_declare``: the old next occurrence stays unless the times changed."""
    reset = old is None or not d.same_times(old)
    start = now if old is None else old.next_occurrence_at
    first = planner.first_occurrence(d, start) if reset else start
    return (d.name, d.target_kind, d.target, d.cron, d.every_seconds, d.anchor, d.timezone,
            d.missed, d.max_catchup, d.overlap, d.cooldown_seconds, d.jitter_seconds,
            d.dst_gap, d.dst_fold, first)  # fmt: skip


_Rows = list[tuple[Any, ...]]


def _writes(
    plans: list[tuple[ScheduleInfo, TickPlan]], fired: Iterator[EventId], requested: dict[str, list[datetime]]
) -> tuple[_Rows, _Rows, _Rows]:
    """The rows of a tick: occurrences inserted, requested ones fired, schedules advanced.

    ``fired`` are the ids of the events published for the plans' work, in order.
    """
    new: _Rows = []
    moved: _Rows = []
    advance: _Rows = []
    for info, plan in plans:
        last: EventId | None = None
        for o in plan.occurrences:
            event_id = next(fired) if o.work is not None else None
            last = event_id if event_id is not None else last
            if o.existing and event_id is not None:
                moved.append((info.name, o.scheduled_for, event_id))
            else:
                new.append((info.name, o.scheduled_for, o.status, event_id))
        waiting = len(requested.get(info.name, ()))
        more = waiting > _REQUESTED_PER_TICK or (plan.failed and waiting > 0)
        advance.append(
            (info.name, info.next_occurrence_at, plan.next_occurrence_at, plan.next_run_at,
             plan.buffered_for, last, more)
        )  # fmt: skip
    return new, moved, advance


def _columns(rows: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows to the column arrays of an ``unnest``."""
    return [list(column) for column in zip(*rows, strict=True)]
