"""Exceptions raised by eventbus.

Every error derives from one root::

    EventBusError
    ├── ConfigurationError        bad DSN, schema name or setting
    │   ├── InvalidSchedule       a schedule's spec or policy is invalid
    │   └── InvalidUpcaster       an event's upcasters are declared wrong
    ├── RegistrationError         a subscription cannot be registered
    │   ├── DuplicateSubscription
    │   └── HandlerSignatureError
    ├── PublishError              an event cannot be published
    │   ├── PayloadTooLarge
    │   ├── UnknownEventType
    │   ├── EncodeError           the event or its headers cannot be encoded
    │   └── InvalidKey            a key or ordering key that is not a str without NUL
    ├── DecodeError               a stored payload does not match its type
    │   ├── MissingUpcaster       a stored version with no upcaster to the class's version
    │   └── FutureEventVersion    a stored version newer than the class knows
    ├── BackendError              the database refused or went away
    │   ├── BackendUnavailable
    │   └── ResultNotStored       a handler's result the database refused
    ├── MigrationError
    │   ├── MigrationChecksumMismatch
    │   └── SchemaNotMigrated
    ├── NotFound                  no such delivery or event
    │   ├── UnknownSchedule
    │   ├── UnknownMachine
    │   ├── UnknownInstance
    │   └── UnknownApproval
    ├── WorkflowError             a state-machine operation was refused
    │   ├── DefinitionError       the state table is invalid
    │   │   ├── UncappedCycle
    │   │   ├── UndeclaredState
    │   │   └── UnreachableState
    │   ├── GuardMismatch
    │   │   └── RunEnded          a signal for a run that is over
    │   ├── CheckpointTooLarge
    │   ├── InvalidCheckpoint     a checkpoint that does not match its type
    │   └── InvalidOutcome        an outcome a state returned that cannot be committed
    ├── HandlerInterrupted        a handler outlived the shutdown grace period
    ├── HandlerTimeout            a handler ran past its timeout
    ├── FanOutError               a fan-out schedule's tenant lister raised
    └── HandlerSignal             raised by handlers to steer their delivery
        ├── Retry
        └── DeadLetter

Each class's docstring is its default message.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "CheckpointTooLarge",
    "ConfigurationError",
    "DeadLetter",
    "DecodeError",
    "DefinitionError",
    "DuplicateSubscription",
    "EncodeError",
    "EventBusError",
    "ExtraNotInstalled",
    "FanOutError",
    "FutureEventVersion",
    "GuardMismatch",
    "HandlerInterrupted",
    "HandlerSignal",
    "HandlerSignatureError",
    "HandlerTimeout",
    "InvalidCheckpoint",
    "InvalidKey",
    "InvalidOutcome",
    "InvalidSchedule",
    "InvalidUpcaster",
    "MigrationChecksumMismatch",
    "MigrationError",
    "MissingUpcaster",
    "NotFound",
    "PayloadTooLarge",
    "PublishError",
    "RegistrationError",
    "ResultNotStored",
    "Retry",
    "RunEnded",
    "SchemaNotMigrated",
    "UncappedCycle",
    "UndeclaredState",
    "UnknownApproval",
    "UnknownEventType",
    "UnknownInstance",
    "UnknownMachine",
    "UnknownSchedule",
    "UnreachableState",
    "WorkflowError",
]


class EventBusError(Exception):
    """An eventbus error occurred."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigurationError(EventBusError):
    """The bus is misconfigured."""


class InvalidSchedule(ConfigurationError):
    """The schedule's spec or policy is invalid."""


class InvalidUpcaster(ConfigurationError):
    """An event's upcasters are declared wrong (a version the class does not follow, twice, or a gap)."""


class ExtraNotInstalled(ConfigurationError):
    """A feature needs an optional dependency that is not installed (the message names the extra)."""


class RegistrationError(EventBusError):
    """A subscription cannot be registered."""


class DuplicateSubscription(RegistrationError):
    """A subscription with this name is already registered."""


class HandlerSignatureError(RegistrationError):
    """The handler's signature does not match its event type."""


class PublishError(EventBusError):
    """The event cannot be published."""


class PayloadTooLarge(PublishError):
    """The encoded payload exceeds the configured size limit."""


class UnknownEventType(PublishError):
    """No event class is known for this event type."""


class EncodeError(PublishError):
    """The event or its headers cannot be encoded."""


class InvalidKey(PublishError):
    """A key or ordering key must be a str without NUL characters."""


class DecodeError(EventBusError):
    """The stored payload does not decode to its event type."""


class MissingUpcaster(DecodeError):
    """The stored event's version has no upcaster to its class's version."""


class FutureEventVersion(DecodeError):
    """The stored event is newer than its class: run the code that declares its version."""


class BackendError(EventBusError):
    """The database refused the operation."""


class BackendUnavailable(BackendError):
    """The database cannot be reached."""


class ResultNotStored(BackendError):
    """The database refused to store a handler's result.

    The worker records the delivery's attempt as failed with this error in
    place of the result (a completion whose follow-ups cannot be stored, say),
    so it is retried or dead-lettered like any other failure.
    """


class MigrationError(EventBusError):
    """Migrations cannot be applied."""


class MigrationChecksumMismatch(MigrationError):
    """An applied migration file has been edited since it was applied."""


class SchemaNotMigrated(MigrationError):
    """The database schema is missing or out of date: run `eventbus migrate`."""


class NotFound(EventBusError):
    """No such delivery or event."""


class HandlerInterrupted(EventBusError):
    """The handler was still running when the worker's shutdown grace period ended.

    The interrupted run counts as a failed attempt, so a handler that hangs
    reaches the dead-letter queue after ``max_attempts`` restarts.
    """


class UnknownSchedule(NotFound):
    """No schedule of that name is recorded."""


class HandlerTimeout(EventBusError):
    """The handler ran past its timeout and was cancelled."""


class FanOutError(EventBusError):
    """A fan-out schedule's tenant lister raised: nothing of the occurrence was started; it is retried."""


class HandlerSignal(EventBusError):
    """Raised by a handler to steer what happens to its delivery."""


class Retry(HandlerSignal):
    """The handler asked for the delivery to be retried later."""

    def __init__(self, delay: float | None = None, reason: str | None = None) -> None:
        super().__init__(reason or "retry requested by handler")
        self.delay = delay


class DeadLetter(HandlerSignal):
    """The handler asked for the delivery to be dead-lettered."""


class UnknownMachine(NotFound):
    """No machine of this name is included in the bus."""


class UnknownInstance(NotFound):
    """No instance of this machine has this key."""


class UnknownApproval(NotFound):
    """No approval has this id."""


class WorkflowError(EventBusError):
    """The state-machine operation was refused."""


class DefinitionError(WorkflowError, RegistrationError):
    """The state table of the machine is invalid."""


class UncappedCycle(DefinitionError):
    """A cycle of the state table passes no state with max_visits or max_age."""


class UndeclaredState(DefinitionError):
    """An edge leads to a state the machine does not declare."""


class UnreachableState(DefinitionError):
    """A declared state cannot be reached from the initial state."""


class GuardMismatch(WorkflowError):
    """The instance is not in the expected state or moved on since it was read; nothing changed."""


class CheckpointTooLarge(WorkflowError):
    """The encoded checkpoint is over the machine's max_checkpoint_bytes."""


class RunEnded(GuardMismatch):
    """The run this was meant for has ended (or a newer run replaced it); nothing was stored."""


class InvalidCheckpoint(WorkflowError):
    """The checkpoint does not match the machine's checkpoint type (a field of the wrong type)."""


class InvalidOutcome(WorkflowError):
    """A state's outcome cannot be committed (a Fail code that is not a str, a bad poll)."""
