"""State-machine pointers, history, signals, approvals and effects."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

import msgspec
import orjson

from ...types import (
    WorkflowApprovalRow,
    WorkflowChildRow,
    WorkflowDefinitionRow,
    WorkflowEffectRow,
    WorkflowHistoryRow,
    WorkflowInstance,
    WorkflowSignalRow,
)
from .delivery import OutgoingEvent, WorkflowStart

__all__ = [
    "ALL_CHILDREN",
    "EFFECT_JSON",
    "ENDED_STATUSES",
    "SignalResult",
    "StateTransaction",
    "WorkflowApprovalRequest",
    "WorkflowEffect",
    "WorkflowFacts",
    "WorkflowHistoryEntry",
    "WorkflowStore",
    "WorkflowTransition",
    "signal_target",
    "workflow_step",
]


ALL_CHILDREN = -1
"""``WorkflowTransition.children_wait`` for "every child of the run", counted when the transition commits."""

ENDED_STATUSES = ("completed", "failed", "cancelled")
"""Statuses of a run that ended: a child in one of them is an outcome its parents read."""

EFFECT_JSON = ("ref",)
"""The JSON columns of an effect row: its ``ref`` is read back decoded."""

SignalResult = Literal["sent", "duplicate", "missing", "ended"]
"""What :meth:`WorkflowStore.signal` did with a signal."""

LIVE_STATUSES = frozenset({"pending", "running", "waiting", "waiting_approval", "paused", "uncertain"})
"""Statuses of a run that has not ended: a signal is kept for it."""


def signal_target(pointer: Any, run_id: int | None) -> SignalResult | None:
    """Why a signal cannot be stored for the instance ``pointer`` (None: it can, for its run)."""
    if pointer is None or (run_id is not None and run_id > pointer["run_id"]):
        return "missing"
    if (run_id is not None and run_id < pointer["run_id"]) or pointer["status"] not in LIVE_STATUSES:
        return "ended"
    return None


def workflow_step(
    machine: str, key: str, version: int, reason: str, delay: float = 0.0, priority: int = 0
) -> OutgoingEvent:
    """The internal step event that runs one visit of ``(machine, key)`` at ``version``.

    Its dedupe key names the version and the reason, so each cause publishes
    at most one step per version; its ordering key is the instance, so the
    machine's ordered subscription never runs two visits of it at once.
    ``priority`` is the run's (``WorkflowInstance.priority``): each step a
    backend publishes for a run takes it from the row the same write reads.
    """
    return OutgoingEvent(
        event_type=f"wf.step.{machine}",
        payload=orjson.dumps({"key": key, "version": version, "reason": reason}),
        key=f"wf/{machine}/{key}/v{version}/{reason}",
        delay_seconds=max(0.0, delay),
        ordering_key=f"{machine}/{key}",
        priority=priority,
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
    woken_by: str | None = None
    """What woke the visit, from the reason of the step event that ran it (``signal:NAME``,
    ``timer``...: the state-machines guide lists them); None for an operator's action."""


class WorkflowEffect(msgspec.Struct, frozen=True):
    """An irreversible effect recorded with a transition, for compensation."""

    state: str
    op_key: str
    kind: str
    ref: str
    """The effect's reference, JSON-encoded (read back decoded as ``WorkflowEffectRow.ref``)."""
    compensation: str | None


class WorkflowApprovalRequest(msgspec.Struct, frozen=True):
    """A new pending approval, tied to the hash of its exact input."""

    state: str
    input: bytes
    input_hash: str
    timeout_seconds: float


class WorkflowFacts(msgspec.Struct, frozen=True):
    """What a visit decides on, read once: the pointer and what is open for its run.

    ``signals``: the unconsumed signals of the current run, in arrival order.
    ``approvals``: the current run's approvals not yet used by a transition
    (``consumed_version`` is None, whatever their status), oldest first.
    ``effects``: every effect recorded in the current run, in the order recorded.
    ``children``: the child runs of the current run, in the order they were started.
    """

    instance: WorkflowInstance
    signals: tuple[WorkflowSignalRow, ...] = ()
    approvals: tuple[WorkflowApprovalRow, ...] = ()
    effects: tuple[WorkflowEffectRow, ...] = ()
    children: tuple[WorkflowChildRow, ...] = ()


class WorkflowTransition(msgspec.Struct, frozen=True):
    """Everything one transition writes, applied in one transaction or not at all.

    Guarded by ``expected_version`` (and by ``lease`` = (delivery id, lease
    token) when a visit commits it): when the pointer moved on, nothing is
    written. ``step`` is the reason of the next step event (None: none is
    published), due after ``step_delay`` seconds. When an open signal named in
    ``wake_on`` exists at commit, the step is due at once, and one is published
    even when ``step`` is None (a signal that arrived during the visit, which
    saw the instance running and so woke nothing).

    ``starts`` are child runs started with the transition, each linked to this
    run (a live run of the key, left alone, is linked instead). With
    ``children_wait`` the instance waits on its children: it wakes when
    ``children_ended`` reaches that count (:data:`ALL_CHILDREN`: all the run's
    children), at once if it already has. A transition into a terminal status
    ends the run as a child (its parents' counts move on, and the one that
    crosses a parent's wait wakes it); into ``cancelled``, it cancels the live
    children the run started, and theirs.
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
    starts: tuple[WorkflowStart, ...] = ()
    children_wait: int | None = None


class StateTransaction(Protocol):
    """The open transaction a transactional state writes in (see :meth:`WorkflowStore.transaction`)."""

    @property
    def connection(self) -> Any:
        """The driver's connection inside the transaction (asyncpg, or aiosqlite), as ``ctx.connection``."""
        ...

    async def commit(self, t: WorkflowTransition) -> int | None:
        """Write ``t`` as :meth:`WorkflowStore.commit` does, in this transaction, and commit it with
        everything written before; its new version. None when the transition is refused (stale,
        or its delivery's lease is gone): the whole transaction rolls back, the state's writes too.
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

    async def start(
        self, machine: str, key: str, state: str, checkpoint: bytes, once: bool = False, priority: int = 0
    ) -> tuple[WorkflowInstance, bool]:
        """Create the instance (or a new run of a finished one) and publish its first step.

        ``priority`` is stored on the run (a new run of the key takes it), and
        every step of the run is published with it: the first, and each one a
        transition, a signal, a decision, a child's end or a sweep publishes.

        Returns the instance and whether a run was started; a live run is left
        alone and returned with False, and so, with ``once``, is a run that
        completed (a failed or cancelled one is started again). One guarded
        statement decides: of concurrent starts of a key, one starts the run.
        With ``once`` the instance is marked ``kept`` (a run started, or a
        completed one found), so retention keeps the completed run it relies on.
        """
        ...

    async def load(self, machine: str, key: str) -> WorkflowInstance | None:
        """The pointer as committed, with ``has_signals`` telling whether its run has open signals."""
        ...

    async def facts(self, machine: str, keys: Sequence[str]) -> dict[str, WorkflowFacts]:
        """The :class:`WorkflowFacts` of many keys of one machine, in one read; absent keys are left out.

        The pointer is read as :meth:`load` reads it (``has_signals`` tells
        whether ``signals`` is non-empty). A backend reads the signals,
        approvals and effects only for the instances that have some, so a
        batch of plain visits costs one query. The parts need not share a
        snapshot: a transition decided on them is guarded by the pointer's
        version, and signals and approvals are consumed by guarded writes.
        """
        ...

    async def commit(self, t: WorkflowTransition) -> int | None:
        """Apply ``t`` atomically; return the new version, or None when the guard refused it."""
        ...

    def transaction(self, timeout_seconds: float) -> AbstractAsyncContextManager[StateTransaction]:
        """Open the transaction of one visit of a transactional state, of at most ``timeout_seconds``.

        As :meth:`DeliveryStore.transaction`: the state writes through its
        ``connection``, :meth:`StateTransaction.commit` writes the transition
        in it, and leaving the block without a commit rolls everything back.
        """
        ...

    async def commit_many(self, ts: Sequence[WorkflowTransition]) -> list[int | None]:
        """As :meth:`commit` for each, in one transaction (one commit for the batch).

        Each transition is guarded on its own: a refused one writes nothing and
        does not affect the others. Results are in input order.
        """
        ...

    async def find(
        self, machine: str, status: str | None, state: str | None, limit: int
    ) -> list[WorkflowInstance]:
        """Instances of a machine, by key, optionally filtered by status and state."""
        ...

    async def counts(self, machine: str, cap: int | None = None) -> dict[tuple[str, str], int]:
        """Instances per (state, status); with ``cap``, each count stops at ``cap + 1`` (more than ``cap``).

        Capped, the groups are found by skipping through the (machine, status,
        state) index and each is counted up to ``cap + 1`` rows, so the read is
        bounded however many instances there are.
        """
        ...

    async def history(self, machine: str, key: str) -> builtins.list[WorkflowHistoryRow]:
        """Every history row of an instance, in version order."""
        ...

    async def signals(self, machine: str, key: str, open_only: bool) -> builtins.list[WorkflowSignalRow]:
        """Signals of an instance in arrival order (only unconsumed ones with ``open_only``)."""
        ...

    async def signal(
        self,
        machine: str,
        key: str,
        name: str,
        payload: bytes,
        dedupe: str | None,
        wake_states: Sequence[str],
        run_id: int | None = None,
    ) -> SignalResult:
        """Store a signal for the instance's live run (``run_id`` when given, which must be it).

        ``"sent"`` when stored; ``"duplicate"`` when its dedupe id was already
        taken in that run; ``"missing"`` when there is no instance (or no run
        ``run_id``); ``"ended"`` when the run is over (a newer run does not
        take it). In the same transaction, an instance that is ``waiting`` in
        one of ``wake_states`` gets a step event for its current version.
        """
        ...

    async def approvals(self, machine: str, key: str) -> builtins.list[WorkflowApprovalRow]:
        """Every approval of an instance, oldest first."""
        ...

    async def approval(self, approval_id: int) -> WorkflowApprovalRow | None:
        """One approval by id."""
        ...

    async def decide(
        self, approval_id: int, status: str, by: str, reason: str | None
    ) -> WorkflowApprovalRow | None:
        """Pending and unexpired -> ``status``, recording who and why; None when the guard refused.

        The instance, if still ``waiting_approval``, gets a step event in the same transaction.
        """
        ...

    async def effects(self, machine: str, key: str, run_id: int) -> builtins.list[WorkflowEffectRow]:
        """The effects recorded in one run, in the order they were recorded."""
        ...

    async def sweep(self, machine: str, grace_seconds: float, limit: int = 500) -> int:
        """Publish a step for live instances due for over ``grace_seconds`` that have no step
        pending or processing (their tick was lost); return how many."""
        ...

    async def record_definition(self, machine: str, def_hash: str, definition: bytes) -> None:
        """Record the table ``def_hash`` (``definition`` is its JSON) as the one now in force.

        A table seen before keeps its ``first_registered_at`` and gets a new
        ``registered_at``, so the newest ``registered_at`` is the table in force.
        """
        ...

    async def definition(self, machine: str) -> WorkflowDefinitionRow | None:
        """The table in force (the one recorded most recently), or None when none was."""
        ...
