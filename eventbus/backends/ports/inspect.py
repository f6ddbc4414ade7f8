"""Read-only views for the CLI and the dashboard."""

from __future__ import annotations

from typing import Protocol

from ...types import (
    ChainEvent,
    DeliveryDetail,
    DeliveryFilter,
    DeliveryId,
    DeliveryRow,
    EventView,
    StatusDetails,
    StatusReport,
    SubscriptionInfo,
    WorkerRow,
)
from .rollup import RollupBucket

__all__ = ["Inspector"]


class Inspector(Protocol):
    """Read-only views for the CLI and a dashboard."""

    async def status(self, window: int | None = None) -> StatusReport:
        """Delivery counts by subscription and status, the oldest runnable age, workers.

        ``window``: bounded counts (see :attr:`StatusReport.window` and :func:`windowed`).
        """
        ...

    async def show(self, delivery_id: int) -> DeliveryDetail:
        """One delivery with its event and failure history; :class:`NotFound` if absent."""
        ...

    async def subscriptions(self) -> list[SubscriptionInfo]:
        """Every recorded subscription by name, with state, last worker report and backlog."""
        ...

    async def subscription_names(self) -> list[str]:
        """Every recorded subscription's name, in order, and nothing else (no count is read)."""
        ...

    async def workers(self) -> list[WorkerRow]:
        """The workers table as :meth:`status` reports it, and nothing else (no count is read)."""
        ...

    async def chain(self, event_id: int, limit: int = 1000) -> list[ChainEvent]:
        """The correlation chain ``event_id`` belongs to, flat and oldest first.

        The root (the chain's first event) and every event correlated to it, up
        to ``limit``, each with its deliveries; ``children`` are left empty
        (:meth:`Bus.trace` builds the tree). :class:`NotFound` if no such event.
        """
        ...

    async def health(self, window: int | None = None) -> StatusDetails:
        """Every event type in the log, each subscription's queue, and storage health.

        Reads partial indexes and bounded windows only, so it stays fast at
        millions of rows; counts that are bounded say so in their ``*_capped``
        flag. Tables and the xmin horizon are PostgreSQL's (empty on SQLite).
        ``window``: the cap of the event counts and the window of recent
        completions, in place of 100,000 each.
        """
        ...

    async def find(
        self, flt: DeliveryFilter, limit: int = 50, before_id: int | None = None
    ) -> list[DeliveryRow]:
        """Deliveries matching ``flt``, newest (highest id) first, below ``before_id`` when given.

        The cursor is the last id of the previous page, so paging stays one
        index range scan however deep it goes.
        """
        ...

    async def count(self, flt: DeliveryFilter, cap: int) -> int:
        """How many deliveries match ``flt``, counting no further than ``cap + 1``.

        A result above ``cap`` means "more than cap": the count stops there so
        that it stays fast on millions of rows.
        """
        ...

    async def event(self, event_id: int) -> EventView:
        """One event with its payload, headers and every delivery with its history.

        :class:`NotFound` if there is no such event.
        """
        ...

    async def delivery_ids(
        self, flt: DeliveryFilter, limit: int, after_id: int = 0, *, listing: bool = False
    ) -> list[DeliveryId]:
        """Ids of deliveries matching ``flt`` above ``after_id``, in id order, at most ``limit``.

        The walk behind bulk replay, purge and cancel: each batch is one index
        range read from where the previous one stopped, so a walk over millions
        of rows never rereads what it passed. Such a walk reads the primary; a
        ``listing`` (ids only shown, never acted on) may be read from a replica.
        """
        ...

    async def rollup(
        self, since: int, step_seconds: int, subscription: str | None = None
    ) -> list[RollupBucket]:
        """The throughput rollup from the minute ``since`` (epoch seconds) on, summed per subscription
        and step of ``step_seconds`` (a multiple of 60), oldest step first.

        Reads the rollup table alone (one range read of its minute index),
        never the deliveries; ``subscription`` keeps only its rows. Steps
        without rows are absent.
        """
        ...
