"""The :class:`~eventbus.backends.base.Inspector` port on SQLite: read-only views.

Every read runs on the reader link, outside any write transaction. The
dashboard's filtered reads (deliveries, counts, events) run under a progress
handler that interrupts them past :data:`INSPECT_TIMEOUT_SECONDS`, the SQLite
counterpart of PostgreSQL's statement timeout: an expensive filter fails fast
instead of holding the reader. Times are REAL epoch seconds.
"""

from __future__ import annotations

import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...errors import BackendUnavailable, NotFound
from ...types import (
    AttemptRecord,
    ChainEvent,
    DeliveryDetail,
    DeliveryFilter,
    DeliveryId,
    DeliveryRow,
    EventView,
    StatusDetails,
    StatusReport,
    StatusRow,
    SubscriptionInfo,
    WorkerRow,
)
from .._observe import COUNT_CAP, RECENT_WINDOW, chain_of, event_types_of, rollup_buckets, subscriptions_of
from .._rows import row_as, rows_as, windowed
from .._sql import contains_like, message_like
from ..ports import RollupBucket
from ._db import SQLiteDb
from ._link import Queries
from ._units import ids_json, to_epoch, to_time

__all__ = ["INSPECT_TIMEOUT_SECONDS", "SQLiteInspector"]

T = TypeVar("T")
INSPECT_TIMEOUT_SECONDS = 5.0
_PROGRESS_STEPS = 10_000  # virtual-machine instructions between two looks at the clock
_MAX_ID = 2**63 - 1


class SQLiteInspector:
    """Status, deliveries, events and chains, read from the file."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def status(self, window: int | None = None) -> StatusReport:
        q = self._db.q
        return await self._db.read(lambda c: _status(c, q, window))

    async def show(self, delivery_id: int) -> DeliveryDetail:
        found = await self._db.fetch("detail", {"id": delivery_id})
        if not found:
            raise NotFound(f"no delivery {delivery_id}")
        history = rows_as(AttemptRecord, await self._db.fetch("history", {"id": delivery_id}))
        return detail_of(found[0], history)

    async def subscriptions(self) -> list[SubscriptionInfo]:
        return rows_as(SubscriptionInfo, await self._db.fetch("subscriptions"))

    async def subscription_names(self) -> list[str]:
        return [r[0] for r in await self._db.fetch("subscription_names")]

    async def workers(self) -> list[WorkerRow]:
        q = self._db.q
        return await self._db.read(lambda c: rows_as(WorkerRow, c.execute(q["status_workers"])))

    async def chain(self, event_id: int, limit: int = 1000) -> list[ChainEvent]:
        q = self._db.q
        return await self._db.read(lambda c: _chain(c, q, event_id, limit))

    async def health(self, window: int | None = None) -> StatusDetails:
        q = self._db.q
        return await self._db.read(lambda c: _health(c, q, window))

    async def rollup(
        self, since: int, step_seconds: int, subscription: str | None = None
    ) -> list[RollupBucket]:
        params = {"since": since, "step": step_seconds, "subscription": subscription}
        counts = await self._db.fetch("rollup_counts", params)
        return rollup_buckets(counts, await self._db.fetch("rollup_durations", params))

    async def find(
        self, flt: DeliveryFilter, limit: int = 50, before_id: int | None = None
    ) -> list[DeliveryRow]:
        params = {**filter_params(flt, before_id), "limit": limit}
        q, twin = self._db.q, _twin(flt)  # a twin reads its rows' own index alone
        query = (
            q["find_deliveries_dead"] if twin == "dead"
            else q["find_deliveries_stuck"] if twin == "stuck"
            else q["find_deliveries_retrying"] if twin == "retrying"
            else q["find_deliveries"]
        )  # fmt: skip
        return rows_as(DeliveryRow, await self._bounded(query, params))

    async def count(self, flt: DeliveryFilter, cap: int) -> int:
        params = {**filter_params(flt), "cap": cap + 1}
        q, twin = self._db.q, _twin(flt)
        query = (
            q["count_deliveries_dead"] if twin == "dead"
            else q["count_deliveries_stuck"] if twin == "stuck"
            else q["count_deliveries_retrying"] if twin == "retrying"
            else q["count_deliveries"]
        )  # fmt: skip
        return int((await self._bounded(query, params))[0][0])

    async def event(self, event_id: int) -> EventView:
        q = self._db.q
        return await self._db.read(bounded(lambda c: _event(c, q, event_id)))

    async def delivery_ids(
        self, flt: DeliveryFilter, limit: int, after_id: int = 0, *, listing: bool = False
    ) -> list[DeliveryId]:
        params = {**filter_params(flt), "after_id": after_id, "limit": limit}
        twin = _twin(flt)
        found = await self._db.fetch(
            "delivery_ids_dead" if twin == "dead"
            else "delivery_ids_stuck" if twin == "stuck"
            else "delivery_ids_retrying" if twin == "retrying"
            else "delivery_ids",
            params,
        )  # fmt: skip
        return [DeliveryId(int(r[0])) for r in found]

    async def _bounded(self, sql: str, params: dict[str, Any]) -> list[sqlite3.Row]:
        return await self._db.read(bounded(lambda c: c.execute(sql, params).fetchall()))


def _twin(flt: DeliveryFilter) -> str:
    """Which twin of a filtered read serves ``flt``: its condition's, the dead letters', or none."""
    return flt.condition or ("dead" if flt.status == "dead" else "")


def bounded(body: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """``body`` interrupted once it has run for :data:`INSPECT_TIMEOUT_SECONDS`."""

    def run(conn: sqlite3.Connection) -> T:
        deadline = time.monotonic() + INSPECT_TIMEOUT_SECONDS
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
        try:
            return body(conn)
        except sqlite3.OperationalError as exc:
            if "interrupted" not in str(exc):
                raise
            raise BackendUnavailable(
                f"SQLite: an inspection ran past {INSPECT_TIMEOUT_SECONDS:g}s and was interrupted"
            ) from exc
        finally:
            conn.set_progress_handler(None, 0)

    return run


def filter_params(flt: DeliveryFilter, before_id: int | None = None) -> dict[str, Any]:
    """The named parameters of the filtered reads: every field, and the id range they allow."""
    low, high = _id_range(flt.ids, before_id)
    return {
        "ids": None if flt.ids is None else ids_json(flt.ids),
        "low_id": low,
        "high_id": high,
        "subscription": flt.subscription,
        "status": flt.status,
        "event_type": flt.event_type,
        "event_id": flt.event_id,
        "key": flt.key,
        "correlation_id": flt.correlation_id,
        "since": to_epoch(flt.since),
        "until": to_epoch(flt.until),
        "path": f"$.{flt.payload_path}" if flt.payload_path else None,
        "payload_value": flt.payload_value,
        "error_like": contains_like(flt.error_contains),
        "message_like": message_like(flt.message_pattern),
        "payload_like": contains_like(flt.payload_contains),
        "condition": flt.condition,
        "now": time.time(),
    }


def _id_range(ids: Sequence[int] | None, before_id: int | None) -> tuple[int, int]:
    """The ids a read may look at: those named (an empty range for none), below the cursor."""
    low, high = (0, _MAX_ID) if ids is None else (min(ids, default=1), max(ids, default=0))
    if before_id is not None:
        high = min(high, before_id - 1)
    return int(low), int(high)


def detail_of(row: sqlite3.Row, history: Sequence[AttemptRecord] = ()) -> DeliveryDetail:
    return row_as(DeliveryDetail, row, json=("headers",), history=history)


def _status(c: sqlite3.Connection, q: Queries, window: int | None) -> StatusReport:
    if window is None:
        rows, events = c.execute(q["status"]), c.execute(q["status_events"])
    else:
        rows = c.execute(q["status_recent"], {"window": window})
        events = c.execute(q["status_events_capped"], {"window": window})
    report = StatusReport(
        rows=rows_as(StatusRow, rows),
        oldest_pending_seconds=c.execute(q["status_oldest_pending"]).fetchone()[0],
        events=events.fetchone()[0],
        workers=rows_as(WorkerRow, c.execute(q["status_workers"])),
        subscriptions=rows_as(SubscriptionInfo, c.execute(q["subscriptions"])),
    )
    return report if window is None else windowed(report, report.rows, window)


def _event(conn: sqlite3.Connection, q: Queries, event_id: int) -> EventView:
    event = conn.execute(q["event_row"], {"id": event_id}).fetchone()
    if event is None:
        raise NotFound(f"no event {event_id}")
    history: defaultdict[int, list[AttemptRecord]] = defaultdict(list)
    for r in conn.execute(q["event_history"], {"id": event_id}):
        history[int(r["delivery_id"])].append(row_as(AttemptRecord, r))
    deliveries = [
        detail_of(r, history[int(r["id"])]) for r in conn.execute(q["event_deliveries"], {"id": event_id})
    ]
    return row_as(EventView, event, json=("headers",), deliveries=deliveries)


def _timed(row: sqlite3.Row, *names: str) -> dict[str, Any]:
    """A row as a mapping with its epoch-seconds columns ``names`` as datetimes."""
    out = dict(row)
    for name in names:
        if out.get(name) is not None:
            out[name] = to_time(out[name])
    return out


def _chain(conn: sqlite3.Connection, q: Queries, event_id: int, limit: int) -> list[ChainEvent]:
    root = conn.execute(q["chain_root"], {"id": event_id}).fetchone()
    if root is None:
        raise NotFound(f"no event {event_id}")
    found = conn.execute(q["chain_events"], {"root": root[0], "limit": limit}).fetchall()
    events = [_timed(r, "created_at") for r in found]
    event_ids = ids_json([e["id"] for e in events])
    deliveries = conn.execute(q["chain_deliveries"], {"event_ids": event_ids}).fetchall()
    return chain_of(events, [_timed(r, "updated_at") for r in deliveries])


def _health(conn: sqlite3.Connection, q: Queries, window: int | None) -> StatusDetails:
    cap, newest = (COUNT_CAP, RECENT_WINDOW) if window is None else (window, window)
    now = conn.execute(q["now"]).fetchone()[0]
    types = conn.execute(q["health_event_types"], {"cap": cap}).fetchall()
    versions = conn.execute(q["health_event_versions"], {"cap": cap}).fetchall()
    subs = [_timed(r, "last_seen_at") for r in conn.execute(q["health_subscriptions"], {"now": now})]
    recent = conn.execute(q["health_completed_recent"], {"now": now, "limit": newest}).fetchall()
    last = conn.execute(q["health_last_prune"]).fetchone()
    return StatusDetails(
        event_types=event_types_of(types, versions, cap),
        queues=subscriptions_of(subs, recent, newest),
        last_prune_at=None if last is None else to_time(last[0]),
    )
