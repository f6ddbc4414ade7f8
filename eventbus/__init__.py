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
    EventBusError,
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
from .types import DeadLetterFilter, DeliveryDetail, PublishResult, StatusReport
from .worker import Worker

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "Bus",
    "ConfigurationError",
    "Context",
    "DeadLetter",
    "DeadLetterFilter",
    "DecodeError",
    "DeliveryDetail",
    "DuplicateSubscription",
    "Envelope",
    "Event",
    "EventBusError",
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
    "StatusReport",
    "Subscription",
    "UnknownEventType",
    "Worker",
]
