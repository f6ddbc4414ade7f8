"""eventbus: a durable, typed event bus for Python services.

PostgreSQL is the source of truth in production; an embedded SQLite file is the
zero-setup default.
"""

from .bus import Bus, Envelope
from .context import Context
from .errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    DeadLetter,
    DecodeError,
    DuplicateSubscription,
    EncodeError,
    EventBusError,
    HandlerInterrupted,
    HandlerSignal,
    HandlerSignatureError,
    HandlerTimeout,
    MigrationChecksumMismatch,
    MigrationError,
    NotFound,
    PayloadTooLarge,
    PublishError,
    RegistrationError,
    Retry,
    SchemaNotMigrated,
    UnknownEventType,
)
from .event import Event
from .retry import RetryPolicy
from .router import Router, Subscription
from .types import (
    AttemptRecord,
    DeadLetterFilter,
    DeliveryDetail,
    DeliveryId,
    DeliveryStatus,
    EventId,
    PublishResult,
    StartFrom,
    StatusReport,
    StatusRow,
    SubscriptionInfo,
    SubscriptionState,
    WorkerRow,
)
from .worker import Worker

__all__ = [
    "AttemptRecord",
    "BackendError",
    "BackendUnavailable",
    "Bus",
    "ConfigurationError",
    "Context",
    "DeadLetter",
    "DeadLetterFilter",
    "DecodeError",
    "DeliveryDetail",
    "DeliveryId",
    "DeliveryStatus",
    "DuplicateSubscription",
    "EncodeError",
    "Envelope",
    "Event",
    "EventBusError",
    "EventId",
    "HandlerInterrupted",
    "HandlerSignal",
    "HandlerSignatureError",
    "HandlerTimeout",
    "MigrationChecksumMismatch",
    "MigrationError",
    "NotFound",
    "PayloadTooLarge",
    "PublishError",
    "PublishResult",
    "RegistrationError",
    "Retry",
    "RetryPolicy",
    "Router",
    "SchemaNotMigrated",
    "StartFrom",
    "StatusReport",
    "StatusRow",
    "Subscription",
    "SubscriptionInfo",
    "SubscriptionState",
    "UnknownEventType",
    "Worker",
    "WorkerRow",
]
