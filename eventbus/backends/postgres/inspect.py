"""The inspection port on PostgreSQL: status, deliveries, events, chains and health.

The dashboard's reads (``find``, ``count``, ``event``) run in a read-only
transaction with a statement timeout of their own (``inspect_timeout``), so an
expensive filter fails fast instead of holding a pooled connection.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from ...errors import NotFound
from ...types import (
    AttemptRecord,
    ChainEvent,
    DeliveryDetail,
    DeliveryFilter,
    DeliveryId,
    DeliveryRow,
    EventView,
    HorizonHolder,
    StatusDetails,
    StatusReport,
    StatusRow,
    SubscriptionInfo,
    TableHealth,
    WorkerRow,
)
from .._observe import COUNT_CAP, RECENT_WINDOW, chain_of, event_types_of, rollup_buckets, subscriptions_of
from .._rows import row_as, rows_as, windowed
from .._sql import contains_like, message_like
from ..ports import RollupBucket
from ._db import PgDb
from ._reads import ReadPool

__all__ = ["PgInspector"]


def filter_args(flt: DeliveryFilter) -> list[Any]:
    """The fourteen positional parameters every filtered delivery query shares.

    The second is the status, or the condition within one that the filter
    asks for (``stuck``, ``retrying``: it names its status itself).
    """
    path = flt.payload_path.split(".") if flt.payload_path else None
    ids = None if flt.ids is None else list(flt.ids)
    return [
        flt.subscription, flt.condition or flt.status, flt.event_type, flt.event_id, flt.key,
        flt.correlation_id, flt.since, flt.until, path, flt.payload_value, ids,
        contains_like(flt.error_contains), message_like(flt.message_pattern),
        contains_like(flt.payload_contains),
    ]  # fmt: skip


def _twin(flt: DeliveryFilter, plain: str, dead: str, stuck: str, retrying: str) -> str:
    """The query that reads ``flt``'s rows through their own index: dead letters through
    deliveries_dead, stuck ones through deliveries_lease_until, retrying ones among the pending;
    ``plain`` (a walk of the primary key) otherwise."""
    if flt.condition is not None:
        return stuck if flt.condition == "stuck" else retrying
    return dead if flt.status == "dead" else plain


def detail_of(row: asyncpg.Record, history: Sequence[AttemptRecord] = ()) -> DeliveryDetail:
    """A delivery with its event, from a row of ``detail`` or ``event_deliveries``."""
    return row_as(DeliveryDetail, row, json=("headers",), history=history)


class PgInspector:
    """:class:`~eventbus.backends.ports.Inspector` on PostgreSQL (the contract is there)."""

    def __init__(self, db: PgDb, reads: ReadPool | None = None) -> None:
        self.db = db
        self.q = db.q
        self.reads = reads
        self._readonly_settings = f"{self.q['inspect_timeout']};\n{self.q['inspect_custom_plans']}"
        """Where reads go when the bus has a ``read_dsn`` (a replica); None: the primary."""

    @contextlib.asynccontextmanager
    async def _read(self, operation: str) -> AsyncIterator[Any]:
        """A connection for a read that a replica may answer."""
        if self.reads is None:
            async with self.db.conn(operation) as conn:
                yield conn
            return
        await self.db.open()  # the schema is checked (or migrated) on the primary
        async with self.reads.conn(operation) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _readonly(self, operation: str) -> AsyncIterator[Any]:
        async with self._read(operation) as conn, conn.transaction(readonly=True):
            await conn.execute(self._readonly_settings)  # both SET LOCALs in one round trip
            yield conn

    async def status(self, window: int | None = None) -> StatusReport:
        """Counts by subscription and status, the oldest runnable age, workers, subscriptions."""
        async with self._read("status") as conn:
            if window is None:
                rows = await conn.fetch(self.q["status"])
                events = await conn.fetchval(self.q["status_events"])
            else:
                rows = await conn.fetch(self.q["status_recent"], window)
                events = await conn.fetchval(self.q["status_events_capped"], window)
            oldest = await conn.fetchval(self.q["status_oldest_pending"])
            workers = await conn.fetch(self.q["status_workers"])
            subscriptions = await conn.fetch(self.q["subscriptions"])
            lag = None if self.reads is None else await conn.fetchval(self.q["replica_lag"])
        report = StatusReport(
            rows=rows_as(StatusRow, rows),
            oldest_pending_seconds=oldest,
            events=events,
            workers=rows_as(WorkerRow, workers),
            subscriptions=rows_as(SubscriptionInfo, subscriptions),
            replica_lag_seconds=lag,
        )
        return report if window is None else windowed(report, report.rows, window)

    async def subscriptions(self) -> list[SubscriptionInfo]:
        """Every recorded subscription by name, with its state and backlog."""
        async with self._read("list subscriptions") as conn:
            rows = await conn.fetch(self.q["subscriptions"])
        return rows_as(SubscriptionInfo, rows)

    async def subscription_names(self) -> list[str]:
        async with self._read("list subscription names") as conn:
            return [r[0] for r in await conn.fetch(self.q["subscription_names"])]

    async def workers(self) -> list[WorkerRow]:
        async with self._read("list workers") as conn:
            return rows_as(WorkerRow, await conn.fetch(self.q["status_workers"]))

    async def show(self, delivery_id: int) -> DeliveryDetail:
        """One delivery with its event and failure history; :class:`NotFound` if absent."""
        async with self._read("show") as conn:
            row = await conn.fetchrow(self.q["detail"], delivery_id)
            if row is None:
                raise NotFound(f"no delivery {delivery_id}")
            history = await conn.fetch(self.q["history"], delivery_id)
        return detail_of(row, rows_as(AttemptRecord, history))

    async def chain(self, event_id: int, limit: int = 1000) -> list[ChainEvent]:
        """The correlation chain of ``event_id``, flat and oldest first (see ``Inspector.chain``)."""
        async with self._read("trace") as conn:
            root = await conn.fetchval(self.q["chain_root"], event_id)
            if root is None:
                raise NotFound(f"no event {event_id}")
            events = await conn.fetch(self.q["chain_events"], root, limit)
            deliveries = await conn.fetch(self.q["chain_deliveries"], [e["id"] for e in events])
        return chain_of(events, deliveries)

    async def health(self, window: int | None = None) -> StatusDetails:
        """Event types, queues, tables and the xmin horizon, from bounded reads only."""
        cap, newest = (COUNT_CAP, RECENT_WINDOW) if window is None else (window, window)
        async with self.db.conn() as conn:  # the primary's own statistics, even with a replica
            types = await conn.fetch(self.q["health_event_types"], cap)
            versions = await conn.fetch(self.q["health_event_versions"], cap)
            subs = await conn.fetch(self.q["health_subscriptions"])
            recent = await conn.fetch(self.q["health_completed_recent"], newest)
            tables = await conn.fetch(self.q["health_tables"], self.db.schema)
            horizon = await conn.fetchrow(self.q["health_horizon"])
            last_prune = await conn.fetchval(self.q["health_last_prune"])
        return StatusDetails(
            event_types=event_types_of(types, versions, cap),
            queues=subscriptions_of(subs, recent, newest),
            tables=rows_as(TableHealth, tables),
            horizon=None if horizon is None else row_as(HorizonHolder, horizon),
            last_prune_at=last_prune,
        )

    async def find(
        self, flt: DeliveryFilter, limit: int = 50, before_id: int | None = None
    ) -> list[DeliveryRow]:
        """Deliveries matching ``flt``, newest first, below ``before_id`` (see ``Inspector.find``)."""
        query = _twin(
            flt,
            self.q["find_deliveries"],
            self.q["find_deliveries_dead"],
            self.q["find_deliveries_stuck"],
            self.q["find_deliveries_retrying"],
        )
        async with self._readonly("listing deliveries") as conn:
            rows = await conn.fetch(query, *filter_args(flt), before_id, limit)
        return rows_as(DeliveryRow, rows)

    async def count(self, flt: DeliveryFilter, cap: int) -> int:
        """How many deliveries match ``flt``, counting no further than ``cap + 1``."""
        query = _twin(
            flt,
            self.q["count_deliveries"],
            self.q["count_deliveries_dead"],
            self.q["count_deliveries_stuck"],
            self.q["count_deliveries_retrying"],
        )
        async with self._readonly("counting deliveries") as conn:
            return int(await conn.fetchval(query, *filter_args(flt), cap + 1))

    async def delivery_ids(
        self, flt: DeliveryFilter, limit: int, after_id: int = 0, *, listing: bool = False
    ) -> list[DeliveryId]:
        """Ids matching ``flt`` above ``after_id``, in id order (see ``Inspector.delivery_ids``).

        Dead letters are walked through their partial index, everything else
        along the primary key; a ``listing`` may be read from the replica.
        """
        query = _twin(
            flt,
            self.q["delivery_ids"],
            self.q["delivery_ids_dead"],
            self.q["delivery_ids_stuck"],
            self.q["delivery_ids_retrying"],
        )
        connect = self._read if listing else self.db.conn
        async with connect("listing delivery ids") as conn, conn.transaction():
            await conn.execute(self.q["inspect_custom_plans"])
            rows = await conn.fetch(query, *filter_args(flt), after_id, limit)
        return [DeliveryId(r["id"]) for r in rows]

    async def event(self, event_id: int) -> EventView:
        """One event with its payload, headers and every delivery with its history."""
        async with self._readonly("reading an event") as conn:
            event = await conn.fetchrow(self.q["event_row"], event_id)
            if event is None:
                raise NotFound(f"no event {event_id}")
            rows = await conn.fetch(self.q["event_deliveries"], event_id)
            attempts = await conn.fetch(self.q["event_history"], event_id)
        history: defaultdict[int, list[AttemptRecord]] = defaultdict(list)
        for a in attempts:
            history[a["delivery_id"]].append(row_as(AttemptRecord, a))
        deliveries = [detail_of(r, history[r["id"]]) for r in rows]
        return row_as(EventView, event, json=("headers",), deliveries=deliveries)

    async def rollup(
        self, since: int, step_seconds: int, subscription: str | None = None
    ) -> list[RollupBucket]:
        """The rollup per subscription and step (see ``Inspector.rollup``): two grouped range reads."""
        args = (float(since), float(step_seconds), subscription)
        async with self._readonly("reading the throughput rollup") as conn:
            await conn.execute(self.q["rollup_settings"])
            counts = await conn.fetch(self.q["rollup_counts"], *args)
            durations = await conn.fetch(self.q["rollup_durations"], *args)
        return rollup_buckets(counts, durations)
