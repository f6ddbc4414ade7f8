"""SQLite: the chain and health reads of the Inspector, and the RetentionStore.

Pruning batches run as write transactions on the writer link, one at a time
per process; several processes serialise on the file's write lock, so two
pruners never delete at once (and a batch deleted twice deletes nothing).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import anyio
import orjson

from ...errors import NotFound
from ...types import ChainEvent, StatusDetails
from .._observe import (
    COUNT_CAP,
    RECENT_WINDOW,
    Override,
    chain_of,
    event_types_of,
    shortest_cutoff,
    subscriptions_of,
)
from ..base import PruneBatch
from ._link import Queries
from ._units import to_time

__all__ = ["SQLiteObserve"]

T = TypeVar("T")


def _ids(ids: list[int]) -> str:
    return orjson.dumps(ids).decode()


def _timed(row: sqlite3.Row, *names: str) -> dict[str, Any]:
    out = dict(row)
    for name in names:
        if out.get(name) is not None:
            out[name] = to_time(out[name])
    return out


def _chain(conn: sqlite3.Connection, q: Queries, event_id: int, limit: int) -> list[ChainEvent]:
    root = conn.execute(q["chain_root"], {"id": event_id}).fetchone()
    if root is None:
        raise NotFound(f"no event {event_id}")
    events = [
        _timed(r, "created_at")
        for r in conn.execute(q["chain_events"], {"root": root[0], "limit": limit}).fetchall()
    ]
    rows = conn.execute(q["chain_deliveries"], {"event_ids": _ids([e["id"] for e in events])}).fetchall()
    return chain_of(events, [_timed(r, "updated_at") for r in rows])


def _health(conn: sqlite3.Connection, q: Queries) -> StatusDetails:
    now = conn.execute(q["now"]).fetchone()[0]
    types = conn.execute(q["health_event_types"], {"cap": COUNT_CAP}).fetchall()
    subs = [_timed(r, "last_seen_at") for r in conn.execute(q["health_subscriptions"], {"now": now})]
    recent = conn.execute(q["health_completed_recent"], {"now": now, "limit": RECENT_WINDOW}).fetchall()
    last = conn.execute(q["health_last_prune"]).fetchone()
    return StatusDetails(
        event_types=event_types_of(types),
        queues=subscriptions_of(subs, recent),
        last_prune_at=None if last is None else to_time(last[0]),
    )


def _prune_batch(conn: sqlite3.Connection, q: Queries, now: float, p: dict[str, Any]) -> PruneBatch:
    """One batch in one write transaction: the deliveries past retention, then their events."""
    params = {**p, "now": now}
    batch = conn.execute(q["prune_events"], params).fetchall()
    if not batch:
        return PruneBatch(last_event_id=None, young=False)
    event_ids = _ids([r["id"] for r in batch])
    doomed = conn.execute(q["prune_doomed"], {**params, "event_ids": event_ids}).fetchall()
    doomed_ids = _ids([r["id"] for r in doomed])
    events = conn.execute(
        q["prune_events_doomed"], {**params, "event_ids": event_ids, "doomed": doomed_ids}
    ).fetchall()
    attempts = 0
    if not p["dry_run"]:
        attempts = conn.execute(q["prune_history"], {"ids": doomed_ids}).rowcount
        conn.execute(q["prune_deliveries"], {"ids": doomed_ids})
        conn.execute(q["prune_delete_events"], {"ids": _ids([r["id"] for r in events])})
    newest_cutoff = p["shortest"]
    return PruneBatch(
        last_event_id=int(batch[-1]["id"]),
        young=min(r["created_at"] for r in batch) >= now - newest_cutoff,
        completed=sum(1 for r in doomed if r["status"] != "dead"),
        dead=sum(1 for r in doomed if r["status"] == "dead"),
        attempts=attempts,
        events=len(events),
    )


class SQLiteObserve:
    """Mixed into :class:`SQLiteBackend`: reads for ``trace`` and ``status``, and pruning."""

    q: Queries

    async def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, body: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def chain(self, event_id: int, limit: int = 1000) -> list[ChainEvent]:
        q = self.q
        return await self._read(lambda c: _chain(c, q, event_id, limit))

    async def health(self) -> StatusDetails:
        q = self.q
        return await self._read(lambda c: _health(c, q))

    @contextlib.asynccontextmanager
    async def prune_lock(self) -> AsyncIterator[bool]:
        lock = self.__dict__.setdefault("_prune_lock", anyio.Lock())
        if lock.locked():
            yield False
            return
        async with lock:
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
        return await self._write(_prune_batch, params)

    async def record_prune(self, report: dict[str, Any]) -> None:
        text = orjson.dumps(report).decode()
        await self._write(lambda c, q, now: c.execute(q["prune_record"], {"now": now, "report": text}))
