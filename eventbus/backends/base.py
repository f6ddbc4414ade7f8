"""The backend seam: one object per port, composed into a :class:`Backend`.

A backend is a small object that owns its connections and holds one
implementation of each port (``backend.deliveries.claim(...)``,
``backend.workflows.start(...)``); the ports themselves, their structs and
their contracts live in :mod:`eventbus.backends.ports`, one module each. The
worker is typed against ``deliveries`` and ``wakeups`` only; the CLI and the
dashboard reach storage through :class:`~eventbus.Bus`. Each backend keeps its
own SQL and maps driver errors to :mod:`eventbus.errors`, so no asyncpg or
sqlite3 exception reaches a caller.
"""

from __future__ import annotations

from typing import Literal, Protocol

from .ports import (
    ALL_CHILDREN,
    ChangeFeed,
    ClaimedDelivery,
    Completion,
    DeliveryStore,
    Failure,
    HandlerTransaction,
    Inspector,
    LeaseKey,
    LockWaitExceeded,
    OccurrenceBatch,
    Operator,
    OutgoingEvent,
    PlannedOccurrence,
    PruneBatch,
    Rescue,
    RetentionStore,
    RollupStore,
    ScheduleDecl,
    SchedulePlanner,
    ScheduleStore,
    SchemaStore,
    StateTransaction,
    SubscriptionSpec,
    TickPlan,
    Wakeups,
    WorkflowApprovalRequest,
    WorkflowBatch,
    WorkflowEffect,
    WorkflowFacts,
    WorkflowHistoryEntry,
    WorkflowStart,
    WorkflowStore,
    WorkflowTransition,
    decode_headers,
    warn_not_active,
    workflow_step,
)

__all__ = [
    "ALL_CHILDREN",
    "Backend",
    "ChangeFeed",
    "ClaimedDelivery",
    "Completion",
    "DeliveryStore",
    "Failure",
    "HandlerTransaction",
    "Inspector",
    "LeaseKey",
    "LockWaitExceeded",
    "OccurrenceBatch",
    "Operator",
    "OutgoingEvent",
    "PlannedOccurrence",
    "PruneBatch",
    "Rescue",
    "RetentionStore",
    "RollupStore",
    "ScheduleDecl",
    "SchedulePlanner",
    "ScheduleStore",
    "SchemaStore",
    "StateTransaction",
    "SubscriptionSpec",
    "TickPlan",
    "Wakeups",
    "WorkflowApprovalRequest",
    "WorkflowBatch",
    "WorkflowEffect",
    "WorkflowFacts",
    "WorkflowHistoryEntry",
    "WorkflowStart",
    "WorkflowStore",
    "WorkflowTransition",
    "decode_headers",
    "warn_not_active",
    "workflow_step",
]


class Backend(Protocol):
    """Everything one storage backend provides: its lifecycle and one object per port."""

    @property
    def kind(self) -> Literal["postgres", "sqlite"]:
        """Which backend this is."""
        ...

    @property
    def deliveries(self) -> DeliveryStore:
        """The hot path: publish, register, claim, complete, fail, release, extend, recover."""
        ...

    @property
    def wakeups(self) -> Wakeups:
        """How a waiting worker learns that work may have arrived."""
        ...

    @property
    def inspect(self) -> Inspector:
        """Read-only views for the CLI and the dashboard."""
        ...

    @property
    def operate(self) -> Operator:
        """Guarded admin writes by id."""
        ...

    @property
    def retention(self) -> RetentionStore:
        """Deleting finished rows past their retention."""
        ...

    @property
    def rollup(self) -> RollupStore:
        """Appending to the throughput rollup the charts read."""
        ...

    @property
    def schedules(self) -> ScheduleStore:
        """Schedules and their occurrences."""
        ...

    @property
    def workflows(self) -> WorkflowStore:
        """State-machine pointers, history, signals, approvals and effects."""
        ...

    @property
    def schema(self) -> SchemaStore:
        """Migrations, statistics, dropping the schema."""
        ...

    async def open(self) -> None:
        """Connect; checks the schema is migrated unless the backend migrates on open."""
        ...

    async def aclose(self) -> None:
        """Release every connection; safe to call twice."""
        ...
