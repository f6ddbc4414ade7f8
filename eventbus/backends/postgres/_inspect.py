"""The dashboard's reads on PostgreSQL: filtered delivery lists, capped counts, events and chains.

Each runs in a read-only transaction with a statement timeout of its own
(``inspect_timeout``), so an expensive filter fails fast instead of holding
a pooled connection.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from ...errors import NotFound
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

__all__ = ["PostgresInspection"]


def filter_args(flt: DeliveryFilter) -> list[Any]:
    """The ten positional parameters shared by ``find_deliveries`` and ``count_deliveries``."""
    path = flt.payload_path.split(".") if flt.payload_path else None
    return [
        flt.subscription, flt.status, flt.event_type, flt.event_id, flt.key,
        flt.correlation_id, flt.since, flt.until, path, flt.payload_value,
    ]  # fmt: skip


def row_of(r: asyncpg.Record) -> DeliveryRow:
    return DeliveryRow(**dict(r))


def detail_of(r: asyncpg.Record, history: list[AttemptRecord]) -> DeliveryDetail:
    values = dict(r)
    values["payload"] = bytes(values["payload"])
    values["headers"] = decode_headers(values["headers"])
    return DeliveryDetail(**values, history=history)


class PostgresInspection:
    """Mixed into :class:`PostgresBackend`: the dashboard reads of the :class:`Inspector` port."""

    q: dict[str, str]

    def _conn(self, operation: str = "a query") -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def _inspect(self, operation: str) -> AsyncIterator[Any]:
        async with self._conn(operation) as conn, conn.transaction(readonly=True):
            await conn.execute(self.q["inspect_timeout"])
            yield conn

    async def find_deliveries(
        self, flt: DeliveryFilter, limit: int = 50, before_id: int | None = None
    ) -> list[DeliveryRow]:
        async with self._inspect("listing deliveries") as conn:
            rows = await conn.fetch(self.q["find_deliveries"], *filter_args(flt), before_id, limit)
        return [row_of(r) for r in rows]

    async def count_deliveries(self, flt: DeliveryFilter, cap: int) -> int:
        async with self._inspect("counting deliveries") as conn:
            return int(await conn.fetchval(self.q["count_deliveries"], *filter_args(flt), cap + 1))

    async def event_view(self, event_id: int) -> EventView:
        async with self._inspect("reading an event") as conn:
            event = await conn.fetchrow(self.q["event_row"], event_id)
            if event is None:
                raise NotFound(f"no event {event_id}")
            rows = await conn.fetch(self.q["event_deliveries"], event_id)
            attempts = await conn.fetch(self.q["event_history"], event_id)
        history: defaultdict[int, list[AttemptRecord]] = defaultdict(list)
        for a in attempts:
            values = dict(a)
            history[values.pop("delivery_id")].append(AttemptRecord(**values))
        values = dict(event)
        return EventView(
            id=EventId(values["id"]),
            event_type=values["event_type"],
            key=values["key"],
            payload=bytes(values["payload"]),
            headers=decode_headers(values["headers"]),
            correlation_id=values["correlation_id"],
            causation_id=values["causation_id"],
            created_at=values["created_at"],
            deliveries=[detail_of(r, history[DeliveryId(r["id"])]) for r in rows],
        )

    async def event_chain(self, event_id: int, limit: int = 200) -> list[EventSummary]:
        async with self._inspect("reading an event chain") as conn:
            rows = await conn.fetch(self.q["event_chain"], event_id, limit)
        if not rows:
            raise NotFound(f"no event {event_id}")
        return [EventSummary(**dict(r)) for r in rows]
