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
from ..base import OccurrenceBatch, PruneBatch, WorkflowBatch
from ..ports import AuditBatch, ChunkPass, RollupBatch
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

    async def prune_occurrences(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> OccurrenceBatch:
        at, name = after or (None, None)
        params = {"after_at": at, "after_name": name, "limit": limit, "seconds": older_than_seconds}
        return await self._db.write(prune_occurrences, params, dry_run)

    async def prune_workflows(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> WorkflowBatch:
        at, machine, key = after or (None, None, None)
        params = {"after_at": at, "after_machine": machine, "after_key": key}
        params |= {"limit": limit, "seconds": older_than_seconds}
        return await self._db.write(prune_workflows, params, dry_run)

    async def prune_audit(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> AuditBatch:
        at, last_id = after or (None, None)
        params = {"after_at": at, "after_id": last_id, "limit": limit, "seconds": older_than_seconds}
        return await self._db.write(prune_audit, params, dry_run)

    async def prune_rollup(
        self, after: Any, limit: int, *, older_than_seconds: float, dry_run: bool = False
    ) -> RollupBatch:
        minute, last_id = after or (None, None)
        params = {"after_minute": minute, "after_id": last_id, "limit": limit, "seconds": older_than_seconds}
        return await self._db.write(prune_rollup, params, dry_run)

    async def prune_chunks(self, **_: Any) -> ChunkPass:
        """SQLite's log has no chunks: its events go row by row in :meth:`prune_batch`."""
        return ChunkPass()

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


def prune_occurrences(
    conn: sqlite3.Connection, q: Queries, now: float, p: dict[str, Any], dry_run: bool
) -> OccurrenceBatch:
    """One batch of past occurrences in one write transaction: those not waiting to fire go."""
    batch = conn.execute(q["prune_occurrences_batch"], {**p, "now": now}).fetchall()
    if batch and not dry_run:
        keys = orjson.dumps([(r["schedule"], r["scheduled_for"]) for r in batch]).decode()
        conn.execute(q["prune_occurrences_delete"], {"keys": keys})
    last = (batch[-1]["scheduled_for"], batch[-1]["schedule"]) if len(batch) == p["limit"] else None
    return OccurrenceBatch(last=last, occurrences=len(batch))


def prune_audit(
    conn: sqlite3.Connection, q: Queries, now: float, p: dict[str, Any], dry_run: bool
) -> AuditBatch:
    """One batch of old audit rows in one write transaction."""
    batch = conn.execute(q["prune_audit_batch"], {**p, "now": now}).fetchall()
    if batch and not dry_run:
        conn.execute(q["prune_audit_delete"], {"ids": ids_json([r["id"] for r in batch])})
    last = (batch[-1]["at"], batch[-1]["id"]) if len(batch) == p["limit"] else None
    return AuditBatch(last=last, rows=len(batch))


def prune_rollup(
    conn: sqlite3.Connection, q: Queries, now: float, p: dict[str, Any], dry_run: bool
) -> RollupBatch:
    """One batch of old throughput rollup rows in one write transaction."""
    batch = conn.execute(q["prune_rollup_batch"], {**p, "now": now}).fetchall()
    if batch and not dry_run:
        conn.execute(q["prune_rollup_delete"], {"ids": ids_json([r["id"] for r in batch])})
    last = (batch[-1]["minute"], batch[-1]["id"]) if len(batch) == p["limit"] else None
    return RollupBatch(last=last, rows=len(batch))


def prune_workflows(
    conn: sqlite3.Connection, q: Queries, now: float, p: dict[str, Any], dry_run: bool
) -> WorkflowBatch:
    """One batch of finished instances in one write transaction, each with all its rows."""
    batch = conn.execute(q["prune_workflows_batch"], {**p, "now": now}).fetchall()
    keys = {"keys": orjson.dumps([(r["machine"], r["key"]) for r in batch]).decode()}
    rows = conn.execute(q["prune_workflows_rows"], keys).fetchone()["n"] if batch else 0
    if batch and not dry_run:  # its rows, then the instance (one transaction: the order is for the reader)
        conn.execute(q["prune_workflows_history"], keys)
        conn.execute(q["prune_workflows_signals"], keys)
        conn.execute(q["prune_workflows_effects"], keys)
        conn.execute(q["prune_workflows_approvals"], keys)
        conn.execute(q["prune_workflows_children"], keys)
        conn.execute(q["prune_workflows_instances"], keys)
    last = None
    if len(batch) == p["limit"]:
        last = (batch[-1]["updated_at"], batch[-1]["machine"], batch[-1]["key"])
    return WorkflowBatch(last=last, instances=len(batch), rows=rows)


def record_prune(conn: sqlite3.Connection, q: Queries, now: float, report: str) -> None:
    conn.execute(q["prune_record"], {"now": now, "report": report})
