"""Public value types: ids, states, and what the bus returns to its callers.

They live here, not in the storage seam, so that a user's code, the CLI and a
dashboard depend on values rather than on the backend protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal, NewType

import msgspec

__all__ = [
    "AttemptRecord",
    "DeadLetterFilter",
    "DeliveryDetail",
    "DeliveryId",
    "DeliveryStatus",
    "EventId",
    "PublishResult",
    "StartFrom",
    "StatusReport",
    "StatusRow",
    "SubscriptionInfo",
    "SubscriptionState",
    "WorkerRow",
]

EventId = NewType("EventId", int)
DeliveryId = NewType("DeliveryId", int)
DeliveryStatus = Literal["pending", "processing", "completed", "dead", "cancelled"]
StartFrom = Literal["earliest", "latest"]
SubscriptionState = Literal["active", "paused", "removed"]


class PublishResult(msgspec.Struct, frozen=True):
    """The id of a published event and whether an earlier publish had the same key."""

    event_id: EventId
    duplicate: bool


class AttemptRecord(msgspec.Struct, frozen=True):
    """One failed attempt, from the append-only history."""

    attempt: int
    error_type: str
    message: str
    traceback: str
    duration_seconds: float
    worker_id: str | None
    failed_at: datetime


class DeliveryDetail(msgspec.Struct, frozen=True):
    """A delivery with its event and its failure history."""

    id: DeliveryId
    event_id: EventId
    subscription: str
    event_type: str
    status: DeliveryStatus
    attempts: int
    key: str | None
    payload: bytes
    headers: dict[str, str]
    correlation_id: int | None
    causation_id: int | None
    last_error: str | None
    replays: int
    run_at: datetime
    updated_at: datetime
    created_at: datetime
    history: Sequence[AttemptRecord] = ()


class DeadLetterFilter(msgspec.Struct, frozen=True):
    """Which dead deliveries a dead-letter operation applies to."""

    ids: Sequence[int] | None = None
    subscription: str | None = None
    event_type: str | None = None
    since: datetime | None = None


class StatusRow(msgspec.Struct, frozen=True):
    """How many deliveries of one subscription are in one status."""

    event_type: str
    subscription: str
    status: DeliveryStatus
    count: int


class WorkerRow(msgspec.Struct, frozen=True):
    """A worker process as it last reported itself."""

    id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    listener_ok: bool
    listener_reconnects: int
    silent_seconds: float


class SubscriptionInfo(msgspec.Struct, frozen=True):
    """A subscription as the database knows it, with its backlog.

    ``state``: ``active`` (fanned out and claimed), ``paused`` (fanned out, not
    claimed) or ``removed`` (neither). ``worker_seen_at`` is when a worker
    serving it last reported in (None: never), ``silent_seconds`` how long ago
    that was; ``lag_seconds`` is the age of its oldest runnable pending delivery.
    """

    name: str
    event_type: str
    state: SubscriptionState
    ordered: bool
    created_at: datetime
    worker_seen_at: datetime | None
    silent_seconds: float | None
    pending: int
    processing: int
    dead: int
    lag_seconds: float | None


class StatusReport(msgspec.Struct, frozen=True):
    """Counts by event type, subscription and status, and the oldest pending age."""

    rows: Sequence[StatusRow]
    oldest_pending_seconds: float | None
    events: int
    workers: Sequence[WorkerRow] = ()
    subscriptions: Sequence[SubscriptionInfo] = ()
