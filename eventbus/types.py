"""Public value types: ids, states, and what the bus returns to its callers.

They live here, not in the storage seam, so that a user's code, the CLI and a
dashboard depend on values rather than on the backend protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, NewType

import msgspec

__all__ = [
    "ApprovalStatus",
    "AttemptRecord",
    "ChainDelivery",
    "ChainEvent",
    "DeliveryCondition",
    "DeliveryDetail",
    "DeliveryFilter",
    "DeliveryId",
    "DeliveryRow",
    "DeliveryStatus",
    "DstFold",
    "DstGap",
    "EffectStatus",
    "EventId",
    "EventTypeRow",
    "EventView",
    "HorizonHolder",
    "MissedPolicy",
    "OccurrenceInfo",
    "OccurrenceStatus",
    "OverlapPolicy",
    "PublishResult",
    "ScheduleInfo",
    "StartFrom",
    "StatusDetails",
    "StatusReport",
    "StatusRow",
    "SubscriptionInfo",
    "SubscriptionState",
    "SubscriptionStatus",
    "TableHealth",
    "TickReport",
    "WorkerRow",
    "WorkflowApprovalRow",
    "WorkflowChildRow",
    "WorkflowDefinitionRow",
    "WorkflowEffectRow",
    "WorkflowHistoryRow",
    "WorkflowInstance",
    "WorkflowSignalRow",
    "WorkflowStatus",
    "trace_id_of",
]

EventId = NewType("EventId", int)
"""The id of an event in the log; events of one publisher in sequence get increasing ids."""
DeliveryId = NewType("DeliveryId", int)
"""The id of one delivery: one event for one subscription."""
DeliveryStatus = Literal["pending", "processing", "completed", "dead", "cancelled"]
"""Where a delivery is; ``completed``, ``dead`` and ``cancelled`` are terminal."""
DeliveryCondition = Literal["stuck", "retrying"]
"""A state within a status the dashboard lists apart (see ``DeliveryFilter.condition``)."""
StartFrom = Literal["earliest", "latest"]
"""Where a new subscription starts: the retained log from its start, or events published from now on."""
SubscriptionState = Literal["active", "paused", "removed"]
"""A subscription as operated: served, not claimed while fan-out goes on, or taken out of fan-out."""
MissedPolicy = Literal["all", "latest", "skip"]
"""A schedule's occurrences that fell due while nothing ticked it: fire them all, the newest only, or none."""
OverlapPolicy = Literal["allow", "skip", "buffer_one"]
"""An occurrence due while the previous firing's work runs: fire anyway, skip it, or keep one buffered."""
DstGap = Literal["shift", "skip"]
"""A wall time the clock change skips: fire it moved forward by the gap, or skip it."""
DstFold = Literal["first", "last", "both"]
"""A wall time that occurs twice at a clock change: fire the first, the second, or both."""
OccurrenceStatus = Literal[
    "requested", "buffered", "fired", "skipped_missed", "skipped_overlap", "skipped_dst"
]
"""The fate of one occurrence of a schedule: waiting (``requested``, ``buffered``), fired, or skipped."""
WorkflowStatus = Literal[
    "pending",
    "running",
    "waiting",
    "waiting_approval",
    "paused",
    "completed",
    "failed",
    "cancelled",
    "uncertain",
]
"""Where an instance of a state machine is; ``completed``, ``failed`` and ``cancelled`` are final."""
ApprovalStatus = Literal["pending", "approved", "denied", "expired", "superseded"]
"""Where an approval request is: waiting for a human, decided, or closed unused (expired, superseded)."""
EffectStatus = Literal["done", "compensated", "uncertain"]
"""Where a recorded effect is: in force, undone by its compensation, or unknown after failed compensations."""


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
    event_version: int = 1
    """The version the event was published at (``Bus.decode`` upcasts an older one)."""
    priority: int = 0
    """The priority the event was published with (lower runs first)."""
    lease_until: datetime | None = None
    """While processing: when the lease runs out unless renewed."""
    worker_id: str | None = None
    """The worker that claimed it last."""
    max_attempts: int | None = None
    """Its subscription's attempt limit."""


class DeliveryFilter(msgspec.Struct, frozen=True):
    """Which deliveries an inspection lists or counts; every field given must match.

    ``since``/``until`` bound the delivery's last change (``updated_at``).
    ``payload_path`` is a dotted path into the JSON payload (``customer.id``)
    whose value, as text, must equal ``payload_value``. ``ids`` keeps only
    the deliveries named (replay, purge and cancel act on a selection this way).
    ``error_contains`` and ``payload_contains`` keep the deliveries whose last
    error, or whose event's payload as text, contains the text (ignoring ASCII
    case; ``error_contains=""`` keeps those with any error).
    ``message_pattern`` matches the whole last error against a normalised
    error as :func:`eventbus.triage.normalise` writes it: each placeholder
    (``<n>``, ``<id>``, ``<uuid>``, ``<hex>``, ``<str>``) stands for any text.
    """

    subscription: str | None = None
    status: DeliveryStatus | None = None
    event_type: str | None = None
    event_id: int | None = None
    key: str | None = None
    correlation_id: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    payload_path: str | None = None
    payload_value: str | None = None
    ids: Sequence[int] | None = None
    error_contains: str | None = None
    payload_contains: str | None = None
    message_pattern: str | None = None
    condition: DeliveryCondition | None = None
    """``stuck``: processing with its lease run out; ``retrying``: pending after a
    failed attempt, waiting out its backoff (attempts above 0, run_at ahead)."""


class DeliveryRow(msgspec.Struct, frozen=True):
    """A delivery in a list: what a row of a table shows, without payload or history."""

    id: DeliveryId
    event_id: EventId
    subscription: str
    event_type: str
    status: DeliveryStatus
    attempts: int
    key: str | None
    correlation_id: int | None
    last_error: str | None
    replays: int
    run_at: datetime
    updated_at: datetime
    created_at: datetime
    event_version: int = 1
    """The version the event was published at."""
    lease_until: datetime | None = None
    """While processing: when the lease runs out unless renewed."""
    worker_id: str | None = None
    """The worker that claimed it last."""
    max_attempts: int | None = None
    """Its subscription's attempt limit."""


class EventView(msgspec.Struct, frozen=True):
    """One event with its payload and headers and every delivery it fanned out to, with history."""

    id: EventId
    event_type: str
    key: str | None
    payload: bytes
    headers: dict[str, str]
    correlation_id: int | None
    causation_id: int | None
    created_at: datetime
    deliveries: Sequence[DeliveryDetail] = ()
    event_version: int = 1
    """The version the event was published at (``Bus.decode`` upcasts an older one)."""
    priority: int = 0
    """The priority the event was published with (lower runs first)."""


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
    rescued: int = 0
    """Processing deliveries other workers took back from this one once it was taken for lost."""


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


class EventTypeRow(msgspec.Struct, frozen=True):
    """An event type present in the log, handled or not."""

    event_type: str
    events: int
    """Events of this type in the log, counted up to ``COUNT_CAP``."""
    events_capped: bool
    """True when there are at least ``events`` (the count stopped at its cap)."""
    subscriptions: int
    """Subscriptions of this type (0: nothing handles it yet)."""
    versions: dict[int, int] = {}
    """Each version of this type in the log and its events, each counted up to ``COUNT_CAP``."""


class SubscriptionStatus(msgspec.Struct, frozen=True):
    """One subscription's queue at a glance (every figure from a partial index)."""

    name: str
    event_type: str
    backlog: int
    """Pending deliveries runnable now."""
    scheduled: int
    """Pending deliveries due later (retries with backoff, delayed publishes)."""
    lag_seconds: float | None
    """Age of the oldest runnable pending delivery."""
    in_flight: int
    stuck: int
    """Processing past their lease (their worker is gone or hung; recovery will retry them)."""
    dead: int
    completed_last_hour: int
    completed_last_hour_capped: bool
    """True when the count is a lower bound: only the newest deliveries are looked at."""
    last_seen_at: datetime | None = None
    """When a worker last registered this subscription."""


class TableHealth(msgspec.Struct, frozen=True):
    """PostgreSQL: the size and dead tuples of one of the bus's tables."""

    table: str
    live_tuples: int
    dead_tuples: int
    total_bytes: int
    last_autovacuum: datetime | None


class HorizonHolder(msgspec.Struct, frozen=True):
    """PostgreSQL: the oldest transaction holding back the xmin horizon (VACUUM cannot pass it)."""

    pid: int
    state: str | None
    age_seconds: float
    application_name: str | None


class StatusDetails(msgspec.Struct, frozen=True):
    """The parts of a :class:`StatusReport` read from indexes and catalogs (``Inspector.health``)."""

    event_types: Sequence[EventTypeRow] = ()
    queues: Sequence[SubscriptionStatus] = ()
    tables: Sequence[TableHealth] = ()
    horizon: HorizonHolder | None = None
    last_prune_at: datetime | None = None


class StatusReport(msgspec.Struct, frozen=True):
    """Counts by event type, subscription and status, and the oldest pending age.

    ``rows`` are exact counts over the whole deliveries table (unless
    :attr:`window` says they were bounded); the newer fields come from partial
    indexes and bounded scans, so they stay fast at millions of rows.
    """

    rows: Sequence[StatusRow]
    oldest_pending_seconds: float | None
    events: int
    workers: Sequence[WorkerRow] = ()
    subscriptions: Sequence[SubscriptionInfo] = ()
    event_types: Sequence[EventTypeRow] = ()
    queues: Sequence[SubscriptionStatus] = ()
    """Each subscription's queue, from partial indexes."""
    tables: Sequence[TableHealth] = ()
    """PostgreSQL only."""
    horizon: HorizonHolder | None = None
    """PostgreSQL only: None when no other transaction holds a snapshot."""
    last_prune_at: datetime | None = None
    replica_lag_seconds: float | None = None
    """PostgreSQL with ``read_dsn`` only: how far the replica that answered was behind
    (0 when it had replayed everything it received)."""
    window: int | None = None
    """Set by ``status(window=N)``: the completed and cancelled ``rows`` were counted
    among the newest N deliveries only, and ``events`` no further than N (pending,
    processing and dead stay exact, from their partial indexes). None: every count is exact."""
    window_full: bool = False
    """The window held N deliveries: the completed and cancelled counts are lower bounds."""


class ScheduleInfo(msgspec.Struct, frozen=True):
    """A schedule as stored: its spec, its policies and where it stands.

    ``next_occurrence_at`` is the next occurrence not yet recorded;
    ``next_run_at`` is when a tick looks at the schedule next (sooner while an
    occurrence is buffered or requested, later during a cooldown).
    """

    name: str
    target_kind: Literal["event", "machine"]
    target: str
    cron: str | None
    every_seconds: float | None
    anchor: datetime
    timezone: str
    missed: MissedPolicy
    max_catchup: int
    overlap: OverlapPolicy
    cooldown_seconds: float
    jitter_seconds: float
    dst_gap: DstGap
    dst_fold: DstFold
    next_occurrence_at: datetime
    next_run_at: datetime
    last_run_at: datetime | None = None
    last_event_id: EventId | None = None
    last_finished_at: datetime | None = None
    buffered_for: datetime | None = None
    requested: bool = False
    paused: bool = False
    updated_at: datetime | None = None


class OccurrenceInfo(msgspec.Struct, frozen=True):
    """One occurrence of a schedule, keyed by (schedule, scheduled_for), with its fate.

    ``finished_at`` is set for a fired occurrence once every delivery of its
    event is terminal (completed, dead or cancelled).
    """

    schedule: str
    scheduled_for: datetime
    status: OccurrenceStatus
    event_id: EventId | None = None
    fired_at: datetime | None = None
    finished_at: datetime | None = None


class TickReport(msgspec.Struct, frozen=True):
    """What a tick did, and how long until the next schedule is due (None: none is)."""

    schedules: int
    fired: int
    recorded: int
    next_due_in: float | None
    full: bool
    """The batch was full: more schedules may be due now."""


class WorkflowInstance(msgspec.Struct, frozen=True):
    """The pointer of one state-machine instance, as last committed.

    ``version`` is the fencing token: every committed transition bumps it, and
    every write is guarded by the version it read. ``checkpoint`` is the
    encoded checkpoint (``Machine.instance`` decodes it).
    """

    machine: str
    key: str
    run_id: int
    state: str
    status: WorkflowStatus
    version: int
    visits: dict[str, int]
    attempts: int
    checkpoint: bytes
    last_error_code: str | None
    last_error: str | None
    held_state: str | None
    compensate_to: str | None
    next_run_at: datetime | None
    state_entered_at: datetime
    run_started_at: datetime
    updated_at: datetime
    now: datetime
    """The database clock when the row was read (caps on age use it)."""
    has_signals: bool = False
    kept: bool = False
    """A start with ``once=True`` named this key: retention keeps its row while it is completed."""
    children_ended: int = 0
    """How many child runs of the current run have ended."""
    children_wait: int | None = None
    """The ``children_ended`` count a run waiting on its children wakes at (None: it waits on none)."""
    has_children: bool = False
    priority: int = 0
    """The run's priority (0 to 9, lower first), given by its start: each step of the run has it."""


class WorkflowChildRow(msgspec.Struct, frozen=True):
    """One child run of a parent run: what it is and, once it ended, how it ended."""

    machine: str
    key: str
    run_id: int
    started: bool
    """False when the parent found the key's run live (or completed, with ``once``) and waits on it."""
    status: str | None
    """``completed``, ``failed`` or ``cancelled`` once the child ended; None while it is live."""
    state: str | None
    """The state the child ended in (None while it is live)."""
    checkpoint: bytes | None
    """The child's final checkpoint, encoded (None while it is live)."""
    error_code: str | None
    error: str | None
    ended_at: datetime | None


class WorkflowDefinitionRow(msgspec.Struct, frozen=True):
    """The shape of a machine's table as a worker recorded it (see ``Machine.definition``)."""

    machine: str
    def_hash: str
    definition: dict[str, Any]
    first_registered_at: datetime
    """When a worker first started with this table."""
    registered_at: datetime
    """When a worker last started with it: the newest is the table in force."""


class WorkflowHistoryRow(msgspec.Struct, frozen=True):
    """One visit (or operator action) of an instance, append-only."""

    run_id: int
    version: int
    state: str
    visit: int
    outcome: str
    next_state: str
    yielded: bool
    error_code: str | None
    error: str | None
    actor: str
    reason: str | None
    delivery_id: int | None
    started_at: datetime
    at: datetime
    woken_by: str | None = None
    """What woke the visit (``start``, ``timer``, ``signal:NAME``, ``approved:WHO``...: the
    state-machines guide lists them); None when not recorded: an operator's action, or a row
    written before causes were recorded."""


class WorkflowSignalRow(msgspec.Struct, frozen=True):
    """A durable signal sent to one run of an instance; ``consumed_version`` is set once consumed."""

    id: int
    run_id: int
    """The run it was sent to: only a visit of that run reads it."""
    name: str
    dedupe: str | None
    payload: bytes
    created_at: datetime
    consumed_version: int | None


class WorkflowApprovalRow(msgspec.Struct, frozen=True):
    """An approval request, tied to the hash of the exact input it approves.

    What ``bus.workflows.approvals(machine, key)``, ``approve`` and ``deny``
    return, and ``ctx.approval`` in the visit that runs under it.
    """

    id: int
    machine: str
    key: str
    run_id: int
    state: str
    input: bytes
    input_hash: str
    status: ApprovalStatus
    requested_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    consumed_version: int | None = None
    """The version of the transition that closed it (ran the state under it, took the deny or
    timeout edge, or superseded it): a decision is used once, by the visit that asked for it."""


class WorkflowEffectRow(msgspec.Struct, frozen=True):
    """An irreversible effect recorded with a transition (``ctx.record_effect``), and whether it
    was compensated: the ``effect`` a compensation function is given."""

    id: int
    run_id: int
    state: str
    op_key: str
    """The visit's ``op_key`` with the effect's position in the visit: stable across re-runs."""
    kind: str
    ref: Any
    """The ``ref`` given to ``record_effect``, decoded from JSON (a dict, list, str, number or None)."""
    compensation: str | None
    """The name of its registered compensation, if it has one."""
    status: EffectStatus


class ChainDelivery(msgspec.Struct, frozen=True):
    """One subscription's delivery of an event in a chain."""

    id: DeliveryId
    subscription: str
    status: DeliveryStatus
    attempts: int
    last_error: str | None
    replays: int
    updated_at: datetime
    elapsed_seconds: float | None
    """From the event's publication to the delivery's end (None while unfinished)."""
    last_attempt_seconds: float | None
    """Handler time of the last failed attempt, when one failed."""


class ChainEvent(msgspec.Struct, frozen=True):
    """An event of a correlation chain with its deliveries and the events it caused."""

    id: EventId
    event_type: str
    key: str | None
    correlation_id: EventId
    causation_id: EventId | None
    created_at: datetime
    trace_id: str | None
    deliveries: Sequence[ChainDelivery] = ()
    children: Sequence[ChainEvent] = ()


def trace_id_of(headers: dict[str, str]) -> str | None:
    """The trace id an event carries: its ``trace_id`` header, or that of a W3C ``traceparent``.

    A ``traceparent`` counts only in its standard shape (four dash-separated
    fields, a 32-hex-digit trace id); anything else gives None.
    """
    explicit = headers.get("trace_id")
    if explicit:
        return explicit
    parts = headers.get("traceparent", "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and all(c in "0123456789abcdef" for c in parts[1]):
        return parts[1]
    return None


def DeadLetterFilter(
    ids: Sequence[int] | None = None,
    subscription: str | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
) -> DeliveryFilter:
    """Deprecated: use ``DeliveryFilter(status="dead", ...)``; this returns exactly that."""
    import warnings

    warnings.warn(
        'DeadLetterFilter is deprecated: use DeliveryFilter(status="dead", ...)',
        DeprecationWarning,
        stacklevel=2,
    )
    return DeliveryFilter(
        status="dead", ids=ids, subscription=subscription, event_type=event_type, since=since
    )
