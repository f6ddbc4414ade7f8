"""The backend seam: the ports every storage backend provides, split by who uses them.

- :class:`DeliveryStore` is the hot path: publish, claim, results, leases.
- :class:`Wakeups` tells a waiting worker that work may have arrived.
- :class:`Inspector` is read-only, for the CLI and a dashboard.
- :class:`Operator` applies guarded admin writes to named ids.
- :class:`SchemaStore` opens, closes and migrates the schema.

The worker is typed against ``DeliveryStore`` and ``Wakeups``; the CLI against
``Inspector`` and ``Operator``. Each backend keeps its own SQL and maps driver
errors to :mod:`eventbus.errors`, so no asyncpg or sqlite3 exception reaches a
caller. The docstrings below are the contract the contract suite tests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

import msgspec
import orjson

from ..types import (
    DeadLetterFilter,
    DeliveryDetail,
    DeliveryId,
    EventId,
    PublishResult,
    StartFrom,
    StatusReport,
    SubscriptionInfo,
)

log = logging.getLogger("eventbus")

__all__ = [
    "Backend",
    "ClaimedDelivery",
    "Completion",
    "DeliveryStore",
    "Failure",
    "Inspector",
    "Operator",
    "OutgoingEvent",
    "SchemaStore",
    "SubscriptionSpec",
    "Wakeups",
    "decode_headers",
    "warn_not_active",
]


class OutgoingEvent(msgspec.Struct, frozen=True):
    """An encoded event on its way into the log."""

    event_type: str
    payload: bytes
    key: str | None = None
    headers: dict[str, str] = {}
    delay_seconds: float = 0.0
    correlation_id: int | None = None
    causation_id: int | None = None
    ordering_key: str | None = None


class SubscriptionSpec(msgspec.Struct, frozen=True):
    """What a worker records about a subscription when it starts."""

    name: str
    event_type: str
    max_attempts: int
    lease_seconds: float
    ordered: bool = False
    start_from: StartFrom = "earliest"


class ClaimedDelivery(msgspec.Struct):
    """A delivery this worker owns until its lease runs out."""

    id: DeliveryId
    event_id: EventId
    subscription_id: int
    attempts: int
    lease_token: str
    event_type: str
    payload: bytes
    headers: dict[str, str]
    key: str | None
    correlation_id: int | None
    ordering_key: str | None
    created_at: datetime
    position: Any = None
    """Where the row sits in its subscription's claim order, for ``claim(after=…)``."""


class Completion(msgspec.Struct, frozen=True):
    """A successful handler run and the follow-up events it emitted."""

    delivery_id: DeliveryId
    lease_token: str
    follow_ups: Sequence[OutgoingEvent] = ()


class Failure(msgspec.Struct, frozen=True):
    """A failed attempt: retried after ``retry_delay_seconds`` unless ``dead``."""

    delivery_id: DeliveryId
    lease_token: str
    dead: bool
    retry_delay_seconds: float
    error_type: str
    message: str
    traceback: str
    duration_seconds: float
    worker_id: str


def warn_not_active(name: str, state: str) -> None:
    """Tell the operator of a worker that it serves a subscription nothing is claimed from."""
    log.warning(
        "subscription %s is %s: nothing of it is claimed until `eventbus subscriptions resume %s`",
        name,
        state,
        name,
    )


def decode_headers(text: str | None) -> dict[str, str]:
    """Headers as stored (JSON text) back to a dict; anything else is empty."""
    if not text or text == "{}":
        return {}
    value = orjson.loads(text)
    return value if isinstance(value, dict) else {}


class DeliveryStore(Protocol):
    """The hot path: what publishers and workers call for every event."""

    async def publish(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Append ``events`` and fan each out to every subscription of its type, atomically.

        Results are in input order. An event whose (type, key) is already in
        the log inserts nothing and returns the earlier id with
        ``duplicate=True``; so does a key repeated inside the batch. Workers
        waiting on the event types are woken after the commit.
        """
        ...

    async def register(self, specs: Sequence[SubscriptionSpec], *, served: bool = False) -> dict[str, int]:
        """Record subscriptions (create or update) and return their ids by name.

        A subscription seen for the first time with ``start_from="earliest"``
        gets exactly one delivery for every event of its type committed before
        or after the registration, whatever publish transactions overlapped it
        (how long they stayed open, their isolation level): what a backfill
        cannot see yet is owed durably and finished by :meth:`finish_backfills`.
        A paused or removed subscription keeps its state. With ``served`` (a
        worker registering what it serves) the subscriptions count as seen by
        a worker now.
        """
        ...

    async def finish_backfills(self) -> int:
        """Complete owed backfills whose overlapping transactions have all ended; return how many.

        Idempotent and safe to call from any number of processes at once:
        housekeeping calls it periodically. A backfill stays owed, never
        dropped, for as long as an overlapping transaction stays open.
        """
        ...

    async def claim(
        self,
        subscription_id: int,
        limit: int,
        lease_seconds: float,
        worker_id: str,
        ordered: bool = False,
        after: Any = None,
    ) -> list[ClaimedDelivery]:
        """Move up to ``limit`` runnable pending deliveries to processing under one new lease token.

        Each claim counts an attempt. No delivery is held by two claims whose
        leases are both live. With ``ordered``, a keyed delivery is taken only
        as the head of its key (its earliest pending or processing delivery by
        event order) while no delivery of the key is processing: FIFO per key.
        ``after`` is a claim cursor (a previous delivery's ``position``): rows
        before it are not looked at.
        """
        ...

    async def complete(self, completions: Sequence[Completion]) -> set[DeliveryId]:
        """Mark deliveries completed and insert their follow-ups, in one transaction.

        Only a completion whose lease token still holds is applied; the ids
        applied are returned, and a refused one changes nothing.
        """
        ...

    async def fail(self, failures: Sequence[Failure]) -> set[DeliveryId]:
        """Record failed attempts: back to pending at the retry time, or dead.

        Fenced by lease token like :meth:`complete`; returns the ids applied.
        """
        ...

    async def release(self, ids: Sequence[DeliveryId], lease_token: str) -> int:
        """Hand claimed deliveries back to pending without counting the attempt.

        They keep their place (run_at and, per key, event order), and waiting
        workers are woken as by a publish.
        """
        ...

    async def extend(
        self, ids: Sequence[DeliveryId], lease_token: str, lease_seconds: float
    ) -> set[DeliveryId]:
        """Renew leases still held under ``lease_token``; return the ids renewed."""
        ...

    async def recover_expired(self, limit: int = 1000) -> int:
        """Return deliveries whose lease ran out to pending (or dead when out of attempts).

        They keep their place, and waiting workers are woken as by a publish.
        """
        ...

    async def next_run_in(self, subscription_id: int) -> float | None:
        """Seconds until the subscription's next claimable delivery is due, or None.

        Only rows a claim could take count: for an ordered subscription, the
        heads of keys with nothing processing. None when there is none.
        """
        ...

    async def worker_beat(
        self, worker_id: str, *, gone: bool = False, subscription_ids: Sequence[int] = ()
    ) -> None:
        """Record that a worker is alive (or, with ``gone``, that it stopped).

        A live worker also marks the ``subscription_ids`` it serves as seen by
        a worker now.
        """
        ...


class Wakeups(Protocol):
    """How a waiting worker learns that work may have arrived."""

    async def run_listener(self) -> None:
        """Receive wake-ups from other processes until cancelled (a no-op loop where none exist)."""
        ...

    async def wait_for_events(self, timeout: float) -> set[str]:
        """Event types woken since the last call, or an empty set after ``timeout``.

        A wake-up is a hint, never a promise: the caller claims to find out.
        ``SWEEP`` in the set means every subscription.
        """
        ...

    def wake_local(self, event_types: set[str]) -> None:
        """Wake this process's waiting worker for ``event_types``."""
        ...


class Inspector(Protocol):
    """Read-only views for the CLI and a dashboard."""

    async def status(self) -> StatusReport:
        """Delivery counts by subscription and status, the oldest runnable age, workers."""
        ...

    async def list_dead(
        self, flt: DeadLetterFilter, limit: int = 100, after_id: int = 0
    ) -> list[DeliveryDetail]:
        """Dead deliveries matching ``flt`` with id above ``after_id``, in id order."""
        ...

    async def dead_ids(self, flt: DeadLetterFilter, limit: int, after_id: int = 0) -> list[DeliveryId]:
        """As :meth:`list_dead`, ids only: the walk behind bulk replay and purge."""
        ...

    async def show(self, delivery_id: int) -> DeliveryDetail:
        """One delivery with its event and failure history; :class:`NotFound` if absent."""
        ...

    async def list_subscriptions(self) -> list[SubscriptionInfo]:
        """Every recorded subscription by name, with state, last worker report and backlog."""
        ...


class Operator(Protocol):
    """Guarded admin writes by id: each touches only rows still in the expected state."""

    async def replay_ids(self, ids: Sequence[int]) -> int:
        """Dead -> pending with attempts reset and the replay counted; returns how many moved."""
        ...

    async def purge_ids(self, ids: Sequence[int]) -> int:
        """Delete dead deliveries and their attempt history; returns how many."""
        ...

    async def cancel_ids(self, ids: Sequence[int]) -> int:
        """Pending -> cancelled; returns how many moved."""
        ...

    async def pause_subscription(self, name: str) -> bool:
        """Active -> paused: fan-out goes on, claims stop. False if it was not active.

        :class:`NotFound` if no subscription has this name.
        """
        ...

    async def resume_subscription(self, name: str) -> bool:
        """Paused or removed -> active, waking workers for its backlog. False if it was active.

        :class:`NotFound` if no subscription has this name.
        """
        ...

    async def remove_subscription(self, name: str) -> int:
        """Mark removed and cancel its pending deliveries, in one transaction.

        Fan-out and claims skip a removed subscription from the commit on; its
        dead deliveries stay for inspection and purge. Removing it again
        cancels what came back to pending since (a delivery that was running).
        Returns how many pending deliveries were cancelled; :class:`NotFound`
        if no subscription has this name.
        """
        ...


class SchemaStore(Protocol):
    """The connection and the schema."""

    async def open(self) -> None:
        """Connect; checks the schema is migrated unless the backend migrates on open."""
        ...

    async def aclose(self) -> None:
        """Release every connection; safe to call twice."""
        ...

    async def migrate(self) -> list[str]:
        """Apply pending migration files under a lock; return the names applied."""
        ...

    async def analyze(self) -> None:
        """Refresh the planner's statistics of the bus's tables (as autovacuum would)."""
        ...

    async def drop(self) -> None:
        """Delete the bus's tables and data for good: the schema, or the SQLite file. Closes the backend."""
        ...


class Backend(DeliveryStore, Wakeups, Inspector, Operator, SchemaStore, Protocol):
    """Everything one storage backend provides."""

    @property
    def kind(self) -> Literal["postgres", "sqlite"]:
        """Which backend this is."""
        ...
