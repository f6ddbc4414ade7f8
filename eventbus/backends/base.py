"""The backend seam: the ports every storage backend provides, split by who uses them.

- :class:`DeliveryStore` is the hot path: publish, claim, results, leases.
- :class:`Wakeups` tells a waiting worker that work may have arrived.
- :class:`Inspector` is read-only, for the CLI and a dashboard.
- :class:`Operator` applies guarded admin writes to named ids.
- :class:`RetentionStore` deletes what retention no longer keeps.
- :class:`SchemaStore` opens, closes and migrates the schema.
- :class:`ScheduleStore` records schedules and their occurrences and ticks them.
- :class:`WorkflowStore` keeps the pointers and history of state machines.

The worker is typed against ``DeliveryStore`` and ``Wakeups``; the CLI against
``Inspector`` and ``Operator``. Each backend keeps its own SQL and maps driver
errors to :mod:`eventbus.errors`, so no asyncpg or sqlite3 exception reaches a
caller. The docstrings below are the contract the contract suite tests.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

import msgspec
import orjson

from ..types import (
    ChainEvent,
    DeadLetterFilter,
    DeliveryDetail,
    DeliveryFilter,
    DeliveryId,
    DeliveryRow,
    EventId,
    EventSummary,
    EventView,
    OccurrenceInfo,
    OccurrenceStatus,
    PublishResult,
    ScheduleInfo,
    StartFrom,
    StatusDetails,
    StatusReport,
    SubscriptionInfo,
    TickReport,
    WorkflowApprovalRow,
    WorkflowEffectRow,
    WorkflowHistoryRow,
    WorkflowInstance,
    WorkflowSignalRow,
)

log = logging.getLogger("eventbus")

__all__ = [
    "Backend",
    "ClaimedDelivery",
    "Completion",
    "DeliveryStore",
    "Failure",
    "Inspector",
    "LeaseKey",
    "Operator",
    "OutgoingEvent",
    "PlannedOccurrence",
    "PruneBatch",
    "RetentionStore",
    "ScheduleDecl",
    "SchedulePlanner",
    "ScheduleStore",
    "SchemaStore",
    "SubscriptionSpec",
    "TickPlan",
    "Wakeups",
    "WorkerStore",
    "WorkflowApprovalRequest",
    "WorkflowEffect",
    "WorkflowHistoryEntry",
    "WorkflowStore",
    "WorkflowTransition",
    "decode_headers",
    "warn_not_active",
    "workflow_step",
]


LeaseKey = tuple[DeliveryId, str]
"""A delivery under one lease token: what a handler result is fenced by."""


class OutgoingEvent(msgspec.Struct, frozen=True):
    """An encoded event on its way into the log (checked: it can be stored as it is)."""

    event_type: str
    payload: bytes
    key: str | None = None
    headers_json: str = "{}"
    """The headers, encoded once as a JSON object."""
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
    run_at: datetime | None = None
    """When the delivery became runnable (for pickup-latency figures)."""
    causation_id: int | None = None
    """The event whose handler emitted this one."""


class Completion(msgspec.Struct, frozen=True):
    """A successful handler run and the follow-up events it emitted."""

    delivery_id: DeliveryId
    lease_token: str
    follow_ups: Sequence[OutgoingEvent] = ()

    @property
    def lease(self) -> LeaseKey:
        return (self.delivery_id, self.lease_token)


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
    subscription: str = ""
    event_id: int = 0
    attempt: int = 0
    """Which run failed (for the log; the database counts attempts itself)."""

    @property
    def lease(self) -> LeaseKey:
        return (self.delivery_id, self.lease_token)


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


def workflow_step(machine: str, key: str, version: int, reason: str, delay: float = 0.0) -> OutgoingEvent:
    """The internal step event that runs one visit of ``(machine, key)`` at ``version``.

    Its dedupe key names the version and the reason, so each cause publishes
    at most one step per version; its ordering key is the instance, so the
    machine's ordered subscription never runs two visits of it at once.
    """
    return OutgoingEvent(
        event_type=f"wf.step.{machine}",
        payload=orjson.dumps({"key": key, "version": version, "reason": reason}),
        key=f"wf/{machine}/{key}/v{version}/{reason}",
        delay_seconds=max(0.0, delay),
        ordering_key=f"{machine}/{key}",
    )


class WorkflowHistoryEntry(msgspec.Struct, frozen=True):
    """The history row a transition appends (the version is the one it commits)."""

    state: str
    visit: int
    outcome: str
    actor: str
    yielded: bool = False
    error_code: str | None = None
    error: str | None = None
    reason: str | None = None
    delivery_id: int | None = None
    started_at: float | None = None
    """Epoch seconds when the visit started; None means the commit time."""


class WorkflowEffect(msgspec.Struct, frozen=True):
    """An irreversible effect recorded with a transition, for compensation."""

    state: str
    op_key: str
    kind: str
    ref: str
    compensation: str | None


class WorkflowApprovalRequest(msgspec.Struct, frozen=True):
    """A new pending approval, tied to the hash of its exact input."""

    state: str
    input: bytes
    input_hash: str
    timeout_seconds: float


class WorkflowTransition(msgspec.Struct, frozen=True):
    """Everything one transition writes, applied in one transaction or not at all.

    Guarded by ``expected_version`` (and by ``lease`` = (delivery id, lease
    token) when a visit commits it): when the pointer moved on, nothing is
    written. ``step`` is the reason of the next step event (None: none is
    published), due after ``step_delay`` seconds, or at once when an open
    signal named in ``wake_on`` exists.
    """

    machine: str
    key: str
    expected_version: int
    run_id: int
    state: str
    status: str
    visits: dict[str, int]
    checkpoint: bytes
    entered: bool
    attempts: int = 0
    error_code: str | None = None
    error: str | None = None
    held_state: str | None = None
    compensate_to: str | None = None
    new_run: bool = False
    step: str | None = None
    step_delay: float = 0.0
    next_run_in: float | None = None
    wake_on: tuple[str, ...] = ()
    history: WorkflowHistoryEntry | None = None
    consume_signals: tuple[int, ...] = ()
    effects: tuple[WorkflowEffect, ...] = ()
    effect_status: tuple[tuple[int, str], ...] = ()
    approval_request: WorkflowApprovalRequest | None = None
    approval_updates: tuple[tuple[int, str, str], ...] = ()
    """(approval id, expected status, new status), each guarded by the expected status."""
    lease: tuple[int, str] | None = None


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

    async def publish_serial(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """As :meth:`publish`, for a caller that sends one batch at a time (the coalescer).

        A backend may keep a connection for it, so that a lone publish pays no
        pool acquire and release; calls that do overlap wait for each other.
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

    async def complete(self, completions: Sequence[Completion]) -> set[LeaseKey]:
        """Mark deliveries completed and insert their follow-ups, in one transaction.

        Only a completion whose lease token still holds is applied, and only
        its follow-ups are inserted (a stale run of the same delivery in the
        same batch adds none); the (id, token) pairs applied are returned, and
        a refused one changes nothing.
        """
        ...

    async def fail(self, failures: Sequence[Failure]) -> set[LeaseKey]:
        """Record failed attempts: back to pending at the retry time, or dead.

        Fenced by lease token like :meth:`complete`; returns the (id, token)
        pairs applied, and only those append to the attempt history.
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

    async def next_run_in(self, subscription_id: int, after: Any = None) -> float | None:
        """Seconds until the subscription's next claimable delivery is due, or None.

        Only rows a claim could take count: for an ordered subscription, the
        heads of keys with nothing processing. None when there is none. With
        ``after`` (a claim cursor), rows behind it are left to the claim from
        the start that looks there; a backend without cursors ignores it.
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

    async def chain(self, event_id: int, limit: int = 1000) -> list[ChainEvent]:
        """The correlation chain ``event_id`` belongs to, flat and oldest first.

        The root (the chain's first event) and every event correlated to it, up
        to ``limit``, each with its deliveries; ``children`` are left empty
        (:meth:`Bus.trace` builds the tree). :class:`NotFound` if no such event.
        """
        ...

    async def health(self) -> StatusDetails:
        """Every event type in the log, each subscription's queue, and storage health.

        Reads partial indexes and bounded windows only, so it stays fast at
        millions of rows; counts that are bounded say so in their ``*_capped``
        flag. Tables and the xmin horizon are PostgreSQL's (empty on SQLite).
        """
        ...

    async def find_deliveries(
        self, flt: DeliveryFilter, limit: int = 50, before_id: int | None = None
    ) -> list[DeliveryRow]:
        """Deliveries matching ``flt``, newest (highest id) first, below ``before_id`` when given.

        The cursor is the last id of the previous page, so paging stays one
        index range scan however deep it goes.
        """
        ...

    async def count_deliveries(self, flt: DeliveryFilter, cap: int) -> int:
        """How many deliveries match ``flt``, counting no further than ``cap + 1``.

        A result above ``cap`` means "more than cap": the count stops there so
        that it stays fast on millions of rows.
        """
        ...

    async def event_view(self, event_id: int) -> EventView:
        """One event with its payload, headers and every delivery with its history.

        :class:`NotFound` if there is no such event.
        """
        ...

    async def event_chain(self, event_id: int, limit: int = 200) -> list[EventSummary]:
        """The events of ``event_id``'s chain (its root and every event with that root), in id order.

        ``causation_id`` links each to its parent, which makes the causation
        tree; at most ``limit`` events. :class:`NotFound` if there is no such event.
        """
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


class PruneBatch(msgspec.Struct, frozen=True):
    """What one batch of the retention walk deleted (or would delete, on a dry run)."""

    last_event_id: int | None
    """Where the walk goes on from; None when it reached the end of the log."""
    young: bool
    """The batch reached events younger than every cutoff: nothing further can go yet."""
    completed: int = 0
    dead: int = 0
    attempts: int = 0
    events: int = 0


class RetentionStore(Protocol):
    """Deleting finished rows past their retention, in small batches.

    Guarantees, on every backend:

    - a pending or processing delivery is never deleted, nor is a dead one
      younger than ``dead_seconds``, nor a completed or cancelled one that
      finished less than ``completed_seconds`` ago (or its subscription's
      override of either); ``None`` keeps that kind of row forever;
    - an event is deleted only once no delivery of it is left, it is older
      than ``completed_seconds``, and (when keyed) older than
      ``dedup_seconds``: its key is honoured at least that long;
    - each batch is one short transaction that waits for no row lock (rows
      held by another transaction are left for the next pass) and reads a
      bounded range of the log by primary key;
    - at most one pruner holds :meth:`prune_lock` per database (an advisory
      lock on PostgreSQL; on SQLite the file's write lock serialises batches).
    """

    def prune_lock(self) -> contextlib.AbstractAsyncContextManager[bool]:
        """Try to become the one pruner; yields False (at once) when another is."""
        ...

    async def prune_batch(
        self,
        after_event_id: int,
        limit: int,
        *,
        completed_seconds: float | None,
        dead_seconds: float | None,
        dedup_seconds: float,
        dry_run: bool = False,
        overrides: Sequence[tuple[str, float | None, float | None]] = (),
    ) -> PruneBatch:
        """Prune among the ``limit`` events after ``after_event_id`` (by id); see the guarantees.

        ``overrides`` are (subscription name, completed seconds, dead seconds)
        used instead of the bus-wide cutoffs for that subscription's deliveries.
        """
        ...

    async def record_prune(self, report: dict[str, Any]) -> None:
        """Note that a pass ran (``status`` shows when), with its summary."""
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


class ScheduleDecl(msgspec.Struct, frozen=True):
    """A schedule as the code declares it: what it fires, when, and its policies."""

    name: str
    target_kind: Literal["event", "machine"]
    target: str
    cron: str | None
    every_seconds: float | None
    anchor: datetime
    timezone: str
    missed: str
    max_catchup: int
    overlap: str
    cooldown_seconds: float
    jitter_seconds: float
    dst_gap: str
    dst_fold: str

    def same_times(self, row: ScheduleInfo) -> bool:
        """Whether ``row`` stores the same occurrence times (spec, zone and DST policy)."""
        return (self.cron, self.every_seconds, self.anchor, self.timezone, self.dst_gap, self.dst_fold) == (
            row.cron,
            row.every_seconds,
            row.anchor,
            row.timezone,
            row.dst_gap,
            row.dst_fold,
        )


class PlannedOccurrence(msgspec.Struct, frozen=True):
    """One occurrence a tick records or moves on.

    ``existing`` rows (requested or buffered ones) are updated, guarded by
    their status; new ones are inserted. ``work`` is the event a fired
    occurrence publishes, in the same transaction.
    """

    scheduled_for: datetime
    status: OccurrenceStatus
    work: OutgoingEvent | None = None
    existing: bool = False


class TickPlan(msgspec.Struct, frozen=True):
    """What one tick does to one schedule, decided from its row and the database time.

    ``failed``: the schedule could not be planned (logged); nothing is
    recorded, requested occurrences keep waiting, and it is looked at again
    at ``next_run_at``.
    """

    occurrences: Sequence[PlannedOccurrence]
    next_occurrence_at: datetime
    next_run_at: datetime
    buffered_for: datetime | None
    failed: bool = False


class SchedulePlanner(Protocol):
    """The schedule logic a backend calls inside its tick transaction (synchronous, pure).

    It never touches the database: the backend hands it the row it locked,
    the database time and what it found, and applies the plan it returns.
    """

    def names(self) -> Sequence[str]:
        """The schedules this process can fire (the others are left alone), sorted."""
        ...

    @property
    def set_id(self) -> str:
        """A digest of :meth:`names`: the set recorded by ``declare_schedules`` that ticks claim from."""
        ...

    def first_occurrence(self, decl: ScheduleDecl, start: datetime) -> datetime:
        """The first occurrence time (of any fate) at or after ``start``."""
        ...

    def plan(self, row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        """Decide the tick of ``row`` at database time ``now``; never raises (see ``TickPlan.failed``).

        ``row.last_finished_at`` is already brought up to date; ``requested``
        are the times of triggered or backfilled occurrences waiting to fire.
        """
        ...


class ScheduleStore(Protocol):
    """Schedules and their occurrences.

    Guarantees: an occurrence is one row per (schedule, scheduled_for), so it
    is recorded, and fired, at most once; a tick locks the schedules it
    claims (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on
    SQLite) and records their occurrences, publishes their events (with the key
    ``name@scheduled_for``) and advances them in one transaction, on the
    database clock; a crash anywhere before the commit leaves nothing behind.
    "Finished" means every delivery of the fired event is terminal.
    """

    async def declare_schedules(self, decls: Sequence[ScheduleDecl], planner: SchedulePlanner) -> None:
        """Create new schedules and update changed ones; recorded occurrences stay.

        Also records ``planner.set_id`` with its names, the set a tick claims from.

        A changed spec restarts the times at the first new occurrence at or
        after the old ``next_occurrence_at`` (so a window still due stays due).
        """
        ...

    async def tick_schedules(self, planner: SchedulePlanner, limit: int) -> TickReport:
        """Claim up to ``limit`` due schedules of ``planner.set_id`` and apply their plans.

        Cost grows with the schedules due, not with those declared.
        """
        ...

    async def schedules(self, name: str | None = None) -> list[ScheduleInfo]:
        """Every recorded schedule by name, or the one named (empty when unknown)."""
        ...

    async def occurrences(self, name: str, limit: int) -> list[OccurrenceInfo]:
        """The newest ``limit`` occurrences of a schedule, newest first, with finish times."""
        ...

    async def pause_schedule(self, name: str, paused: bool) -> bool:
        """Pause or resume; False when no such schedule exists."""
        ...

    async def remove_schedule(self, name: str) -> bool:
        """Delete a schedule and its occurrence rows; False when it did not exist."""
        ...

    async def request_occurrences(self, name: str, times: Sequence[datetime] | None) -> list[datetime]:
        """Ask for occurrences to fire at the next tick, whatever the policies.

        ``None`` means one occurrence at the database's now (a trigger). Times
        already fired (or waiting) are left alone; skipped ones are requested
        again. Returns the times requested.
        """
        ...


class WorkflowStore(Protocol):
    """Pointers, history, signals, approvals and effects of state machines.

    Guarantees: every pointer write is one guarded statement (``version`` as
    read, plus the status for starts and approvals); a transition's pointer
    update, history row, signal consumption, ledger rows and next step event
    commit together or not at all; a step event is only ever published in the
    transaction that makes its version current, so a step for an old version
    is a no-op by construction.
    """

    async def wf_start(
        self, machine: str, key: str, state: str, checkpoint: bytes
    ) -> tuple[WorkflowInstance, bool]:
        """Create the instance (or a new run of a finished one) and publish its first step.

        Returns the instance and whether a run was started; a live run is left
        alone and returned with False.
        """
        ...

    async def wf_load(self, machine: str, key: str) -> WorkflowInstance | None:
        """The pointer as committed, with ``has_signals`` telling whether open signals exist."""
        ...

    async def wf_load_many(self, machine: str, keys: Sequence[str]) -> dict[str, WorkflowInstance]:
        """As :meth:`wf_load` for many keys of one machine in one query; absent keys are left out."""
        ...

    async def wf_commit(self, t: WorkflowTransition) -> int | None:
        """Apply ``t`` atomically; return the new version, or None when the guard refused it."""
        ...

    async def wf_commit_many(self, ts: Sequence[WorkflowTransition]) -> list[int | None]:
        """As :meth:`wf_commit` for each, in one transaction (one commit for the batch).

        Each transition is guarded on its own: a refused one writes nothing and
        does not affect the others. Results are in input order.
        """
        ...

    async def wf_list(
        self, machine: str, status: str | None, state: str | None, limit: int
    ) -> list[WorkflowInstance]:
        """Instances of a machine, by key, optionally filtered by status and state."""
        ...

    async def wf_counts(self, machine: str) -> dict[tuple[str, str], int]:
        """Instances per (state, status)."""
        ...

    async def wf_history(self, machine: str, key: str) -> list[WorkflowHistoryRow]:
        """Every history row of an instance, in version order."""
        ...

    async def wf_signals(self, machine: str, key: str, open_only: bool) -> list[WorkflowSignalRow]:
        """Signals of an instance in arrival order (only unconsumed ones with ``open_only``)."""
        ...

    async def wf_signal(
        self,
        machine: str,
        key: str,
        name: str,
        payload: bytes,
        dedupe: str | None,
        wake_states: Sequence[str],
    ) -> bool:
        """Store a signal (False when its dedupe id was already taken).

        In the same transaction, an instance that is ``waiting`` in one of
        ``wake_states`` gets a step event for its current version.
        """
        ...

    async def wf_approvals(self, machine: str, key: str) -> list[WorkflowApprovalRow]:
        """Every approval of an instance, oldest first."""
        ...

    async def wf_approval(self, approval_id: int) -> WorkflowApprovalRow | None:
        """One approval by id."""
        ...

    async def wf_decide(
        self, approval_id: int, status: str, by: str, reason: str | None
    ) -> WorkflowApprovalRow | None:
        """Pending and unexpired -> ``status``, recording who and why; None when the guard refused.

        The instance, if still ``waiting_approval``, gets a step event in the same transaction.
        """
        ...

    async def wf_effects(self, machine: str, key: str, run_id: int) -> list[WorkflowEffectRow]:
        """The effects recorded in one run, in the order they were recorded."""
        ...

    async def wf_sweep(self, machine: str, grace_seconds: float, limit: int = 500) -> int:
        """Publish a step for live instances due for over ``grace_seconds`` that have no step
        pending or processing (their tick was lost); return how many."""
        ...


class WorkerStore(DeliveryStore, Wakeups, Protocol):
    """What a worker needs of a backend: the hot path and the wake-ups, nothing else."""


class Backend(
    DeliveryStore,
    Wakeups,
    Inspector,
    Operator,
    RetentionStore,
    SchemaStore,
    ScheduleStore,
    WorkflowStore,
    Protocol,
):
    """Everything one storage backend provides."""

    @property
    def kind(self) -> Literal["postgres", "sqlite"]:
        """Which backend this is."""
        ...
