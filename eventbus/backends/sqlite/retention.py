"""The :class:`~eventbus.backends.base.RetentionStore` port on SQLite.

Pruning batches run as write transactions on the writer link, one at a time
per process; several processes serialise on the file's write lock, so two
pruners never delete at once (and a batch deleted twice deletes nothing).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import orjson

from .._observe import Override, shortest_cutoff
from ..base import PruneBatch
from ._db import SQLiteDb
from ._link import Queries
from ._units import ids_json

__all__ = ["SQLiteRetention"]


class SQLiteRetention:
    """Deleting finished rows past their retention, one small batch at a time."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db
        self._lock = anyio.Lock()

    @contextlib.asynccontextmanager
    async def lock(self) -> AsyncIterator[bool]:
        if self._lock.locked():
            yield False
            return
        async with self._lock:
            yield True

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
        params = {
            "overrides": orjson.dumps([list(o) for o in overrides]).decode(),
            "shortest": shortest_cutoff(completed_seconds, dead_seconds, overrides),
            "after": after_event_id,
            "limit": limit,
            "completed": completed_seconds,
            "dead": dead_seconds,
            "dedup": dedup_seconds,
            "dry_run": dry_run,
        }
        return await self._db.write(prune_batch, params)

    async def record_prune(self, report: dict[str, Any]) -> None:
        await self._db.write(record_prune, orjson.dumps(report).decode())


# -- units of work (on the writer's thread, under the write lock) ---------------------


def prune_batch(conn: sqlite3.Connection, q: Queries, now: float, p: dict[str, Any]) -> PruneBatch:
    """One batch in one write transaction: the deliveries past retention, then their events."""
    params = {**p, "now": now}
    batch = conn.execute(q["prune_events"], params).fetchall()
    if not batch:
        return PruneBatch(last_event_id=None, young=False)
    event_ids = ids_json([r["id"] for r in batch])
    doomed = conn.execute(q["prune_doomed"], {**params, "event_ids": event_ids}).fetchall()
    doomed_ids = ids_json([r["id"] for r in doomed])
    events = conn.execute(
        q["prune_events_doomed"], {**params, "event_ids": event_ids, "doomed": doomed_ids}
    ).fetchall()
    attempts = 0
    if not p["dry_run"]:
        attempts = conn.execute(q["prune_history"], {"ids": doomed_ids}).rowcount
        conn.execute(q["prune_deliveries"], {"ids": doomed_ids})
        conn.execute(q["prune_delete_events"], {"ids": ids_json([r["id"] for r in events])})
    return PruneBatch(
        last_event_id=int(batch[-1]["id"]),
        young=min(r["created_at"] for r in batch) >= now - p["shortest"],
        completed=sum(1 for r in doomed if r["status"] != "dead"),
        dead=sum(1 for r in doomed if r["status"] == "dead"),
        attempts=attempts,
        events=len(events),
    )


def record_prune(conn: sqlite3.Connection, q: Queries, now: float, report: str) -> None:
    conn.execute(q["prune_record"], {"now": now, "report": report})
