"""The dashboard's reads on SQLite: filtered delivery lists, capped counts, events and chains.

Each read runs under a progress handler that interrupts it past
:data:`INSPECT_TIMEOUT_SECONDS`, the SQLite counterpart of PostgreSQL's
statement timeout: an expensive filter fails fast instead of holding the
reader. Times are REAL epoch seconds.
"""

from __future__ import annotations

import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from ...errors import BackendUnavailable, NotFound
from ...types import (
    AttemptRecord,
    DeliveryDetail,
    DeliveryFilter,
    DeliveryId,
    DeliveryRow,
    EventId,
    EventSummary,
    EventView,
)
from ..base import decode_headers
from . import _units as sync

__all__ = ["INSPECT_TIMEOUT_SECONDS", "SQLiteInspection"]

T = TypeVar("T")
INSPECT_TIMEOUT_SECONDS = 5.0
_PROGRESS_STEPS = 10_000  # virtual-machine instructions between two looks at the clock


def filter_params(flt: DeliveryFilter) -> dict[str, Any]:
    """The named parameters shared by ``find_deliveries`` and ``count_deliveries``."""
    return {
        "subscription": flt.subscription,
        "status": flt.status,
        "event_type": flt.event_type,
        "event_id": flt.event_id,
        "key": flt.key,
        "correlation_id": flt.correlation_id,
        "since": sync.to_epoch(flt.since),
        "until": sync.to_epoch(flt.until),
        "path": f"$.{flt.payload_path}" if flt.payload_path else None,
        "payload_value": flt.payload_value,
    }


def row_of(r: sqlite3.Row) -> DeliveryRow:
    values = dict(r)
    for name in ("run_at", "updated_at", "created_at"):
        values[name] = sync.to_time(values[name])
    return DeliveryRow(**values)


def attempt_of(r: sqlite3.Row) -> tuple[int, AttemptRecord]:
    """(delivery id, attempt) from an ``event_history`` row."""
    return int(r[0]), AttemptRecord(
        attempt=r[1],
        error_type=r[2],
        message=r[3],
        traceback=r[4],
        duration_seconds=float(r[5]),
        worker_id=r[6],
        failed_at=sync.to_time(r[7]),
    )


def summary_of(r: sqlite3.Row) -> EventSummary:
    values = dict(r)
    values["created_at"] = sync.to_time(values["created_at"])
    return EventSummary(**values)


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


def event_view(conn: sqlite3.Connection, q: dict[str, str], event_id: int) -> EventView:
    event = conn.execute(q["event_row"], {"id": event_id}).fetchone()
    if event is None:
        raise NotFound(f"no event {event_id}")
    history: defaultdict[int, list[AttemptRecord]] = defaultdict(list)
    for r in conn.execute(q["event_history"], {"id": event_id}):
        delivery_id, attempt = attempt_of(r)
        history[delivery_id].append(attempt)
    deliveries: list[DeliveryDetail] = [
        sync.detail_of(r, history[DeliveryId(r["id"])])
        for r in conn.execute(q["event_deliveries"], {"id": event_id})
    ]
    return EventView(
        id=EventId(event["id"]),
        event_type=event["event_type"],
        key=event["key"],
        payload=bytes(event["payload"]),
        headers=decode_headers(event["headers"]),
        correlation_id=event["correlation_id"],
        causation_id=event["causation_id"],
        created_at=sync.to_time(event["created_at"]),
        deliveries=deliveries,
    )


class SQLiteInspection:
    """Mixed into :class:`SQLiteBackend`: the dashboard reads of the :class:`Inspector` port."""

    q: dict[str, str]

    async def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def find_deliveries(
        self, flt: DeliveryFilter, limit: int = 50, before_id: int | None = None
    ) -> list[DeliveryRow]:
        sql, params = (
            self.q["find_deliveries"],
            {**filter_params(flt), "before_id": before_id, "limit": limit},
        )
        rows = await self._read(bounded(lambda c: c.execute(sql, params).fetchall()))
        return [row_of(r) for r in rows]

    async def count_deliveries(self, flt: DeliveryFilter, cap: int) -> int:
        sql, params = self.q["count_deliveries"], {**filter_params(flt), "cap": cap + 1}
        return int(await self._read(bounded(lambda c: c.execute(sql, params).fetchone()[0])))

    async def event_view(self, event_id: int) -> EventView:
        q = self.q
        return await self._read(bounded(lambda c: event_view(c, q, event_id)))

    async def event_chain(self, event_id: int, limit: int = 200) -> list[EventSummary]:
        sql, params = self.q["event_chain"], {"id": event_id, "limit": limit}
        rows = await self._read(bounded(lambda c: c.execute(sql, params).fetchall()))
        if not rows:
            raise NotFound(f"no event {event_id}")
        return [summary_of(r) for r in rows]
