"""The backend seam: the bus operations every storage backend provides.

Bus and worker only see this module. Each backend keeps its own SQL and maps
driver errors to :mod:`eventbus.errors`, so no asyncpg or sqlite3 exception
reaches a caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, NewType, Protocol

import msgspec
import orjson

__all__ = [
    "AttemptRecord",
    "Backend",
    "ClaimedDelivery",
    "Completion",
    "DeadLetterFilter",
    "DeliveryDetail",
    "DeliveryId",
    "DeliveryStatus",
    "EventId",
    "Failure",
    "OutgoingEvent",
    "PublishResult",
    "StatusReport",
    "SubscriptionSpec",
    "decode_headers",
]

EventId = NewType("EventId", int)
DeliveryId = NewType("DeliveryId", int)
DeliveryStatus = Literal["pending", "processing", "completed", "dead", "cancelled"]
StartFrom = Literal["earliest", "latest"]


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


class PublishResult(msgspec.Struct, frozen=True):
    """The id of a published event and whether an earlier publish had the same key."""

    event_id: EventId
    duplicate: bool


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
    counts_attempt: bool = True


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


class StatusReport(msgspec.Struct, frozen=True):
    """Counts by event type, subscription and status, and the oldest pending age."""

    rows: Sequence[dict[str, Any]]
    oldest_pending_seconds: float | None
    events: int
    workers: Sequence[dict[str, Any]] = ()


def decode_headers(text: str | None) -> dict[str, str]:
    """Headers as stored (JSON text) back to a dict; anything else is empty."""
    if not text or text == "{}":
        return {}
    value = orjson.loads(text)
    return value if isinstance(value, dict) else {}


class Backend(Protocol):
    """The operations a storage backend provides to the bus and the worker."""

    kind: str
    notify_channel: str

    async def open(self) -> None: ...
    async def aclose(self) -> None: ...
    async def migrate(self) -> list[str]: ...

    async def publish(
        self, events: Sequence[OutgoingEvent], connection: Any = None
    ) -> list[PublishResult]: ...

    async def register(self, specs: Sequence[SubscriptionSpec]) -> dict[str, int]: ...

    async def claim(
        self,
        subscription_id: int,
        limit: int,
        lease_seconds: float,
        worker_id: str,
        ordered: bool = False,
        after: Any = None,
    ) -> list[ClaimedDelivery]: ...

    async def complete(self, completions: Sequence[Completion]) -> set[DeliveryId]: ...
    async def fail(self, failures: Sequence[Failure]) -> set[DeliveryId]: ...
    async def release(self, ids: Sequence[DeliveryId], lease_token: str) -> int: ...
    async def extend(
        self, ids: Sequence[DeliveryId], lease_token: str, lease_seconds: float
    ) -> set[DeliveryId]: ...
    async def recover_expired(self, limit: int = 1000) -> int: ...
    async def next_run_in(self, subscription_id: int) -> float | None: ...

    async def run_listener(self) -> None: ...
    async def wait_for_events(self, timeout: float) -> set[str]: ...
    def wake_local(self, event_types: set[str]) -> None: ...
    async def worker_beat(self, worker_id: str, *, gone: bool = False) -> None: ...

    async def status(self) -> StatusReport: ...
    async def list_dead(
        self, flt: DeadLetterFilter, limit: int = 100, after_id: int = 0
    ) -> list[DeliveryDetail]: ...
    async def show(self, delivery_id: int) -> DeliveryDetail: ...
    async def replay(self, flt: DeadLetterFilter, batch_size: int = 1000) -> int: ...
    async def purge(self, flt: DeadLetterFilter, batch_size: int = 1000) -> int: ...
    async def cancel(self, ids: Sequence[int]) -> int: ...
