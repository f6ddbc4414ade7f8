"""The ports a storage backend provides, one module each.

- :mod:`.delivery`: :class:`DeliveryStore` (the hot path: publish, claim,
  results, leases) and :class:`Wakeups` (a waiting worker learns that work may
  have arrived).
- :mod:`.inspect`: :class:`Inspector`, read-only views for the CLI and the dashboard.
- :mod:`.operate`: :class:`Operator`, guarded admin writes to named ids.
- :mod:`.retention`: :class:`RetentionStore`, deleting what retention no longer keeps.
- :mod:`.rollup`: :class:`RollupStore`, the throughput rollup the charts read.
- :mod:`.schedules`: :class:`ScheduleStore`, schedules and their occurrences.
- :mod:`.workflows`: :class:`WorkflowStore`, state-machine pointers and history.
- :mod:`.schema`: :class:`SchemaStore`, migrations.

The docstrings are the contract; ``tests/contract/<port>/`` tests it on every backend.
"""

from .delivery import (
    ChangeFeed,
    ClaimedDelivery,
    Completion,
    DeliveryStore,
    Failure,
    HandlerTransaction,
    LeaseKey,
    LockWaitExceeded,
    OutgoingEvent,
    Rescue,
    SubscriptionSpec,
    Wakeups,
    WorkflowStart,
    decode_headers,
    warn_not_active,
)
from .inspect import Inspector
from .operate import Operator
from .retention import (
    AuditBatch,
    ChunkPass,
    OccurrenceBatch,
    PruneBatch,
    RetentionStore,
    RollupBatch,
    WorkflowBatch,
)
from .rollup import RollupBucket, RollupRow, RollupStore
from .schedules import PlannedOccurrence, ScheduleDecl, SchedulePlanner, ScheduleStore, TickPlan
from .schema import SchemaStore
from .workflows import (
    ALL_CHILDREN,
    EFFECT_JSON,
    ENDED_STATUSES,
    SignalResult,
    StateTransaction,
    WorkflowApprovalRequest,
    WorkflowEffect,
    WorkflowFacts,
    WorkflowHistoryEntry,
    WorkflowStore,
    WorkflowTransition,
    signal_target,
    workflow_step,
)

__all__ = [
    "ALL_CHILDREN",
    "EFFECT_JSON",
    "ENDED_STATUSES",
    "AuditBatch",
    "ChangeFeed",
    "ChunkPass",
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
    "RollupBatch",
    "RollupBucket",
    "RollupRow",
    "RollupStore",
    "ScheduleDecl",
    "SchedulePlanner",
    "ScheduleStore",
    "SchemaStore",
    "SignalResult",
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
    "signal_target",
    "warn_not_active",
    "workflow_step",
]
