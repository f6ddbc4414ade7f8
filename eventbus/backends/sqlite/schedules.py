"""The :class:`~eventbus.backends.base.ScheduleStore` port on SQLite: declare, tick, inspect, operate.

A tick is one ``BEGIN IMMEDIATE`` transaction run whole on the writer's
thread: the write lock keeps any other tick, in this process or another, out
until it commits, so the claim needs no row locks. For each due schedule: the
finish of its last firing, the plan from the planner, the events published,
the occurrences recorded and the schedule advanced, all in that one commit.
Times are REAL epoch seconds.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

import msgspec
import orjson

from ...errors import BackendError
from ...types import EventId, OccurrenceInfo, ScheduleInfo, TickReport
from .._rows import row_as, rows_as
from ..base import ScheduleDecl, SchedulePlanner, TickPlan
from ._db import SQLiteDb
from ._link import Queries
from ._units import publish, to_epoch, to_time

__all__ = ["SQLiteSchedules"]

_REQUESTED_PER_TICK = 1000


class SQLiteSchedules:
    """Schedules and their occurrences in one SQLite file."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def declare(self, decls: Sequence[ScheduleDecl], planner: SchedulePlanner) -> None:
        if decls:
            await self._db.write(declare, decls, planner)

    async def tick(self, planner: SchedulePlanner, limit: int) -> TickReport:
        key = {"set_id": planner.set_id}
        done = await self._db.write_if("schedule_probe", key, tick, planner, limit)
        if done is None:
            due = await self._db.fetch("schedule_next_due", key)
            return TickReport(0, 0, 0, due[0][0] if due else None, False)
        report, types = done
        self._db.wake(types)
        return report

    async def find(self, name: str | None = None) -> list[ScheduleInfo]:
        return [info_of(r) for r in await self._db.fetch("schedules_list", {"name": name})]

    async def occurrences(self, name: str, limit: int) -> list[OccurrenceInfo]:
        found = await self._db.fetch("occurrences_list", {"name": name, "limit": limit})
        return rows_as(OccurrenceInfo, found)

    async def pause(self, name: str, paused: bool) -> bool:
        return await self._db.write(pause, name, paused)

    async def remove(self, name: str) -> bool:
        return await self._db.write(remove, name)

    async def request(self, name: str, times: Sequence[datetime] | None) -> list[datetime]:
        return await self._db.write(request, name, times)


def info_of(row: sqlite3.Row) -> ScheduleInfo:
    return row_as(ScheduleInfo, row, paused=row["paused_at"] is not None)


def _epoch(value: datetime) -> float:
    epoch = to_epoch(value)
    assert epoch is not None
    return epoch


# -- units of work (on the writer's thread, under the write lock) ---------------------


def declare(
    conn: sqlite3.Connection, q: Queries, now: float, decls: Sequence[ScheduleDecl], planner: SchedulePlanner
) -> None:
    if conn.execute(q["schedule_set_known"], {"set_id": planner.set_id}).fetchone() is None:
        conn.execute(q["schedule_set_record"], {"set_id": planner.set_id, "now": now})
        conn.executemany(
            q["schedule_set_name"], [{"set_id": planner.set_id, "name": n} for n in planner.names()]
        )
    names = orjson.dumps([d.name for d in decls]).decode()
    existing = {r["name"]: info_of(r) for r in conn.execute(q["schedule_rows"], {"names": names})}
    for d in sorted(decls, key=lambda d: d.name):
        old = existing.get(d.name)
        reset = old is None or not d.same_times(old)
        start = to_time(now) if old is None else old.next_occurrence_at
        first = planner.first_occurrence(d, start) if reset else start
        params = msgspec.structs.asdict(d)
        params.update(anchor=_epoch(d.anchor), first=_epoch(first), reset=int(reset), now=now)
        conn.execute(q["schedule_declare"], params)


def tick(
    conn: sqlite3.Connection, q: Queries, now: float, planner: SchedulePlanner, limit: int
) -> tuple[TickReport, set[str]]:
    rows = conn.execute(
        q["schedule_claim"], {"set_id": planner.set_id, "now": now, "limit": limit}
    ).fetchall()
    fired = recorded = 0
    types: set[str] = set()
    for row in rows:
        f, r = _tick_one(conn, q, now, planner, info_of(row), types)
        fired, recorded = fired + f, recorded + r
    due = conn.execute(q["schedule_next_due"], {"set_id": planner.set_id}).fetchone()
    due_in = None if due is None else due[0]
    return TickReport(len(rows), fired, recorded, due_in, len(rows) == limit), types


def _tick_one(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    planner: SchedulePlanner,
    row: ScheduleInfo,
    types: set[str],
) -> tuple[int, int]:
    row = _note_finish(conn, q, row)
    requested: list[datetime] = []
    if row.requested:
        found = conn.execute(q["schedule_requested"], {"name": row.name, "limit": _REQUESTED_PER_TICK + 1})
        requested = [to_time(r[0]) for r in found]
    plan = planner.plan(row, to_time(now), requested[:_REQUESTED_PER_TICK])
    last_event = _apply(conn, q, now, row.name, plan, types)
    params = {
        "name": row.name,
        "claimed_at": _epoch(row.next_occurrence_at),
        "next_occurrence_at": _epoch(plan.next_occurrence_at),
        "next_run_at": _epoch(plan.next_run_at),
        "buffered_for": None if plan.buffered_for is None else _epoch(plan.buffered_for),
        "last_event_id": last_event,
        "requested": int(len(requested) > _REQUESTED_PER_TICK or (plan.failed and bool(requested))),
        "now": now,
    }
    if conn.execute(q["schedule_advance"], params).fetchone() is None:
        raise BackendError(f"schedule {row.name!r} moved while its tick held it")
    return sum(o.work is not None for o in plan.occurrences), len(plan.occurrences)


def _note_finish(conn: sqlite3.Connection, q: Queries, row: ScheduleInfo) -> ScheduleInfo:
    """Bring ``last_finished_at`` up to date: the last firing's deliveries all terminal."""
    if row.last_event_id is None or row.last_finished_at is not None:
        return row
    work = conn.execute(q["schedule_work_open"], {"event_id": row.last_event_id}).fetchone()
    if work["open"]:
        return row
    finished = work["last"] if work["last"] is not None else _epoch(row.last_run_at or row.next_run_at)
    params = {"name": row.name, "event_id": row.last_event_id, "finished": finished}
    conn.execute(q["schedule_finished_occurrence"], params)
    conn.execute(q["schedule_finished"], params)
    return msgspec.structs.replace(row, last_finished_at=to_time(finished))


def _apply(
    conn: sqlite3.Connection, q: Queries, now: float, name: str, plan: TickPlan, types: set[str]
) -> EventId | None:
    """Publish the fired occurrences' events and record every occurrence; the last event id."""
    works = [o.work for o in plan.occurrences if o.work is not None]
    published, woken = publish(conn, q, now, works) if works else ([], set())
    types.update(woken)
    results = iter(published)
    last: EventId | None = None
    for o in plan.occurrences:
        event_id = next(results).event_id if o.work is not None else None
        last = event_id if event_id is not None else last
        params = {"name": name, "at": _epoch(o.scheduled_for), "event_id": event_id, "now": now}
        if o.existing and event_id is not None:
            conn.execute(q["occurrence_fire"], params)
        else:
            conn.execute(q["occurrence_insert"], {**params, "status": o.status})
    return last


def request(
    conn: sqlite3.Connection, q: Queries, now: float, name: str, times: Sequence[datetime] | None
) -> list[datetime]:
    if conn.execute(q["schedule_request"], {"name": name, "now": now}).fetchone() is None:
        return []
    stamps = [_epoch(to_time(now))] if times is None else [_epoch(t) for t in times]
    requested = []
    for at in stamps:
        row = conn.execute(q["occurrence_request"], {"name": name, "at": at, "now": now}).fetchone()
        if row is not None:
            requested.append(to_time(row[0]))
    return requested


def pause(conn: sqlite3.Connection, q: Queries, now: float, name: str, paused: bool) -> bool:
    params = {"name": name, "paused": int(paused), "now": now}
    return conn.execute(q["schedule_pause"], params).fetchone() is not None


def remove(conn: sqlite3.Connection, q: Queries, now: float, name: str) -> bool:
    if conn.execute(q["schedule_remove"], {"name": name}).fetchone() is None:
        return False
    conn.execute(q["schedule_remove_occurrences"], {"name": name})
    return True
