"""eventbus: a durable, typed event bus for Python services.

PostgreSQL is the source of truth in production; an embedded SQLite file is the
zero-setup default.

The top level holds the user's model: the bus, events, routers, handlers'
context, the worker, state machines and their outcomes, schedules, hooks,
retention, and the errors a caller catches or a handler raises. What the bus
returns (report rows, filters, ids) lives in :mod:`eventbus.types`; the
errors raised only while a definition is checked, or only recorded by the
worker, in :mod:`eventbus.errors`.
"""

from typing import Any as _Any

from ._deprecated import MovedNames as _MovedNames
from .bus import Bus, Envelope
from .context import Context
from .errors import (
    BackendError,
    BackendUnavailable,
    CheckpointTooLarge,
    ConfigurationError,
    DeadLetter,
    DecodeError,
    DefinitionError,
    EncodeError,
    EventBusError,
    GuardMismatch,
    HandlerSignal,
    HandlerTimeout,
    InvalidKey,
    InvalidSchedule,
    MigrationError,
    NotFound,
    PayloadTooLarge,
    PublishError,
    RegistrationError,
    Retry,
    SchemaNotMigrated,
    UnknownApproval,
    UnknownEventType,
    UnknownInstance,
    UnknownMachine,
    UnknownSchedule,
    WorkflowError,
)
from .event import Event
from .observe import Hooks
from .retention import Retention, RetentionOverride
from .retry import RetryPolicy
from .router import Router
from .schedules import Schedule
from .worker import Worker
from .workflows import Fail, Goto, Machine, StepContext, Uncertain, Yield

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "Bus",
    "CheckpointTooLarge",
    "ConfigurationError",
    "Context",
    "DeadLetter",
    "DecodeError",
    "DefinitionError",
    "EncodeError",
    "Envelope",
    "Event",
    "EventBusError",
    "Fail",
    "Goto",
    "GuardMismatch",
    "HandlerSignal",
    "HandlerTimeout",
    "Hooks",
    "InvalidKey",
    "InvalidSchedule",
    "Machine",
    "MigrationError",
    "NotFound",
    "PayloadTooLarge",
    "PublishError",
    "RegistrationError",
    "Retention",
    "RetentionOverride",
    "Retry",
    "RetryPolicy",
    "Router",
    "Schedule",
    "SchemaNotMigrated",
    "StepContext",
    "Uncertain",
    "UnknownApproval",
    "UnknownEventType",
    "UnknownInstance",
    "UnknownMachine",
    "UnknownSchedule",
    "Worker",
    "WorkflowError",
    "Yield",
]

_MOVED = _MovedNames(
    "eventbus",
    {
        "AttemptRecord": "eventbus.types",
        "ChainDelivery": "eventbus.types",
        "ChainEvent": "eventbus.types",
        "CompositeHooks": "eventbus.observe",
        "DeadLetterFilter": "eventbus.types",
        "DeliveryDetail": "eventbus.types",
        "DeliveryFilter": "eventbus.types",
        "DeliveryId": "eventbus.types",
        "DeliveryOutcome": "eventbus.observe",
        "DeliveryRow": "eventbus.types",
        "DeliveryStatus": "eventbus.types",
        "DstFold": "eventbus.types",
        "DstGap": "eventbus.types",
        "DuplicateSubscription": "eventbus.errors",
        "EventId": "eventbus.types",
        "EventTypeRow": "eventbus.types",
        "EventView": "eventbus.types",
        "ExtraNotInstalled": "eventbus.errors",
        "HandlerInterrupted": "eventbus.errors",
        "HandlerSignatureError": "eventbus.errors",
        "HorizonHolder": "eventbus.types",
        "MigrationChecksumMismatch": "eventbus.errors",
        "MissedPolicy": "eventbus.types",
        "NoHooks": "eventbus.observe",
        "OccurrenceInfo": "eventbus.types",
        "OccurrenceStatus": "eventbus.types",
        "OverlapPolicy": "eventbus.types",
        "PruneReport": "eventbus.retention",
        "PublishResult": "eventbus.types",
        "ResultNotStored": "eventbus.errors",
        "ScheduleInfo": "eventbus.types",
        "StartFrom": "eventbus.types",
        "StatusDetails": "eventbus.types",
        "StatusReport": "eventbus.types",
        "StatusRow": "eventbus.types",
        "Subscription": "eventbus.router",
        "SubscriptionInfo": "eventbus.types",
        "SubscriptionState": "eventbus.types",
        "SubscriptionStatus": "eventbus.types",
        "TableHealth": "eventbus.types",
        "TickReport": "eventbus.types",
        "UncappedCycle": "eventbus.errors",
        "UndeclaredState": "eventbus.errors",
        "UnreachableState": "eventbus.errors",
        "WorkerRow": "eventbus.types",
        "WorkflowApprovalRow": "eventbus.types",
        "WorkflowEffectRow": "eventbus.types",
        "WorkflowHistoryRow": "eventbus.types",
        "WorkflowInstance": "eventbus.types",
        "WorkflowSignalRow": "eventbus.types",
        "WorkflowStatus": "eventbus.types",
    },
    warns_itself={"DeadLetterFilter"},  # each call says to use DeliveryFilter
)


def __getattr__(name: str) -> _Any:
    """Names of the previous release's top level: a :class:`DeprecationWarning`, then the value."""
    return _MOVED.resolve(name)
