"""``bus.workflows``: the machines of a bus and the operations on their instances."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from .._priority import checked_priority
from ..backends.base import WorkflowFacts, WorkflowStart, WorkflowStore, WorkflowTransition
from ..context import Context
from ..errors import (
    ConfigurationError,
    DuplicateSubscription,
    GuardMismatch,
    RunEnded,
    UnknownApproval,
    UnknownInstance,
    UnknownMachine,
)
from ..retry import RetryPolicy
from ..router import Subscription
from ..types import (
    WorkflowApprovalRow,
    WorkflowHistoryRow,
    WorkflowInstance,
    WorkflowSignalRow,
    WorkflowStatus,
)
from . import _decide
from ._commits import CommitQueue
from ._context import Child, child_of
from ._decide import Writer
from ._drift import DefinitionReport, report
from ._engine import Engine
from ._machine import Machine, StartEvent

__all__ = ["Instance", "WorkflowRun", "Workflows"]

log = logging.getLogger("eventbus.workflows")

C = TypeVar("C")
_STEP_RETRY = RetryPolicy(max_attempts=20, base_delay_seconds=0.5, max_delay_seconds=30.0)


@dataclass(frozen=True)
class WorkflowRun:
    """What :meth:`Workflows.start` did, and the run of the key as it is now.

    ``started`` is False when a live run was already there, or, with
    ``once=True``, when a run of the key had completed: then ``status`` is
    ``"completed"``, ``state`` the terminal state it ended in, and
    :attr:`done` is True.
    """

    machine: str
    key: str
    run_id: int
    version: int
    status: WorkflowStatus
    started: bool
    state: str = ""
    """The run's current state (the initial state of a run just started)."""

    @property
    def done(self) -> bool:
        """Nothing was started because a run of the key had completed (``once=True``)."""
        return not self.started and self.status == "completed"


@dataclass(frozen=True)
class Instance(Generic[C]):
    """An instance's pointer with its checkpoint decoded."""

    machine: str
    key: str
    state: str
    status: WorkflowStatus
    run_id: int
    version: int
    visits: dict[str, int]
    checkpoint: C
    last_error_code: str | None
    last_error: str | None
    next_run_at: datetime | None
    state_entered_at: datetime
    updated_at: datetime
    held_state: str | None
    priority: int = 0
    """The run's priority (0 to 9, lower first): every step of the run is published with it."""

    @classmethod
    def of(cls, m: Machine[Any], row: WorkflowInstance) -> Instance[Any]:
        """The pointer ``row`` of machine ``m``, its checkpoint decoded."""
        return cls(
            machine=row.machine,
            key=row.key,
            state=row.state,
            status=row.status,
            run_id=row.run_id,
            version=row.version,
            visits=row.visits,
            checkpoint=m.decode(row.checkpoint),
            last_error_code=row.last_error_code,
            last_error=row.last_error,
            next_run_at=row.next_run_at,
            state_entered_at=row.state_entered_at,
            updated_at=row.updated_at,
            held_state=row.held_state,
            priority=row.priority,
        )


class SubscriptionHost(Protocol):
    """Where a machine's step and start subscriptions go (the bus)."""

    def add(self, subscription: Subscription) -> None: ...


MachineRef = Machine[Any] | str
"""A machine, or the name of one included in the bus."""


def _operator(by: str) -> Writer:
    return Writer(f"operator:{by}")


class Workflows:
    """The machines included in a bus (``bus.include(machine)``) and what is done with their instances.

    Reached as ``bus.workflows``: ``bus.workflows.start(m, checkpoint)``,
    ``.instance(m, key)``, ``.signal(...)``, ``.approve(...)``, ``.repoint(...)``.
    Reads go to ``store``; a visit's transition goes through ``commits``, an
    operator's straight to the store, guarded the same way.

    :param register: records subscriptions by name in the database, so the
        first step of a machine fans out before any worker registered it.
    """

    def __init__(
        self,
        store: WorkflowStore,
        commits: CommitQueue,
        *,
        router: SubscriptionHost,
        register: Callable[[Sequence[str]], Awaitable[object]],
    ) -> None:
        self.store = store
        self.commits = commits
        self.machines: dict[str, Machine[Any]] = {}
        """The included machines, by name."""
        self._router = router
        self._register = register
        self._engines: dict[str, Engine] = {}
        self._registered: set[str] = set()

    def include(self, m: Machine[Any]) -> None:
        """Check the machine's table, then give it its step and start subscriptions."""
        m.check()
        if m.name in self.machines:
            raise DuplicateSubscription(f"a machine named {m.name!r} is already included")
        engine = Engine(m, self.store, self.commits, self, self.ensure_registered)
        self._router.add(
            Subscription(
                name=f"wf.{m.name}",
                event_class=m.step_class,
                handler=engine.handle,
                retry=_STEP_RETRY,
                lease_seconds=m.lease_seconds,
                ordered=True,
            )
        )
        self._router.add(
            Subscription(
                name=f"wf.{m.name}.start",
                event_class=m.start_class,
                handler=self._scheduled_start(m),
                retry=_STEP_RETRY,
            )
        )
        self.machines[m.name] = m
        self._engines[m.name] = engine

    def subscription_names(self) -> set[str]:
        """The names of the subscriptions :meth:`include` added."""
        return {f"wf.{n}" for n in self.machines} | {f"wf.{n}.start" for n in self.machines}

    def _scheduled_start(self, m: Machine[Any]) -> Callable[[StartEvent, Context], Awaitable[None]]:
        """The handler of a machine's start events (fired by schedules): a run at the event's priority."""

        async def start(event: StartEvent, ctx: Context) -> None:
            await self.start(m, m.decode(event.checkpoint.encode()), priority=ctx.priority)

        return start

    def machine(self, machine: MachineRef) -> Machine[Any]:
        """The included machine (by name or itself); :class:`UnknownMachine` if it is not included."""
        name = machine if isinstance(machine, str) else machine.name
        found = self.machines.get(name)
        if found is None:
            raise UnknownMachine(f"no machine named {name!r} is included in this bus")
        return found

    # -- starting and reading --------------------------------------------------

    async def start(
        self, machine: MachineRef, checkpoint: Any, *, once: bool = False, priority: int = 0
    ) -> WorkflowRun:
        """Start a run for the checkpoint's key; idempotent while a run of that key is live.

        A key whose run ended may be started again, from its initial state. With
        ``once=True`` a key whose run *completed* is not: the call starts
        nothing and returns the completed run (``run.done`` is True), so
        content-addressed work ("this video is processed once") is one call. A
        run that failed or was cancelled is started again, as without ``once``.
        The choice is one guarded statement: of concurrent starts of a key,
        exactly one starts a run.

        ``priority`` (0 to 9, as in ``bus.publish``) is the run's, for its whole
        life: every step of the run (the first, each transition's, a wake-up by
        a signal, an approval, a timer or its children, a visit's retry) is
        published with it within the machine's step subscription. It is stored
        on the run (``Instance.priority``); a new run of the key takes the
        priority of the start that begins it.

        :raises InvalidPriority: ``priority`` is not an int from 0 to 9.
        :raises ConfigurationError: the checkpoint is not the machine's type, or
            its key is not a non-empty string of at most 200 characters without NUL.
        """
        request = self.prepare(machine, checkpoint, once=once, priority=priority)
        await self.ensure_registered([request.machine])
        inst, started = await self.store.start(
            request.machine, request.key, request.state, request.checkpoint, request.once, request.priority
        )
        await self._engines[request.machine].maybe_sweep()
        return WorkflowRun(
            inst.machine, inst.key, inst.run_id, inst.version, inst.status, started, inst.state
        )

    def prepare(
        self, machine: MachineRef, checkpoint: Any, *, once: bool = False, priority: int = 0
    ) -> WorkflowStart:
        """The checked, encoded start of a run (what :meth:`start` and ``ctx.start`` write)."""
        m = self.machine(machine)
        if not isinstance(checkpoint, m.checkpoint):
            raise ConfigurationError(f"{m.name!r} takes a {m.checkpoint.__qualname__} checkpoint")
        key = m.key(checkpoint)
        if not isinstance(key, str) or not key or len(key) > 200 or "\x00" in key:
            raise ConfigurationError(
                f"invalid instance key {key!r}: a non-empty string of at most 200 characters, no NUL"
            )
        checked = checked_priority(priority)
        return WorkflowStart(m.name, key, m.initial.name, m.encode(checkpoint), once, checked)

    async def ensure_registered(self, machines: Sequence[str]) -> None:
        """Record the step subscriptions of ``machines``, so a first step fans out before any worker ran."""
        names = [f"wf.{m}" for m in machines if f"wf.{m}" not in self._registered]
        if names:
            await self._register(names)
            self._registered.update(names)

    async def _load(self, m: Machine[Any], key: str) -> WorkflowInstance:
        row = await self.store.load(m.name, key)
        if row is None:
            raise UnknownInstance(f"machine {m.name!r} has no instance {key!r}")
        return row

    async def _facts(self, m: Machine[Any], key: str) -> WorkflowFacts:
        found = (await self.store.facts(m.name, [key])).get(key)
        if found is None:
            raise UnknownInstance(f"machine {m.name!r} has no instance {key!r}")
        return found

    async def instance(self, machine: MachineRef, key: str) -> Instance[Any]:
        """The instance's pointer, read from the database; :class:`UnknownInstance` if absent."""
        m = self.machine(machine)
        return Instance.of(m, await self._load(m, key))

    async def instances(
        self, machine: MachineRef, *, status: str | None = None, state: str | None = None, limit: int = 1000
    ) -> list[Instance[Any]]:
        """Instances of a machine by key, optionally only those in ``status`` and ``state``."""
        m = self.machine(machine)
        return [Instance.of(m, r) for r in await self.store.find(m.name, status, state, limit)]

    async def history(self, machine: MachineRef, key: str) -> list[WorkflowHistoryRow]:
        """One row per visit or operator action, in order."""
        return await self.store.history(self.machine(machine).name, key)

    async def children(self, machine: MachineRef, key: str) -> list[Child]:
        """The child runs of the instance's current run, in start order, each with how it ended
        (``status`` None while live), as a state reads them in ``ctx.children``."""
        m = self.machine(machine)
        return [child_of(row, self.machines) for row in (await self._facts(m, key)).children]

    async def signals(
        self, machine: MachineRef, key: str, *, open_only: bool = False
    ) -> list[WorkflowSignalRow]:
        """The instance's signals in arrival order (only those no visit consumed, with ``open_only``)."""
        return await self.store.signals(self.machine(machine).name, key, open_only)

    async def approvals(self, machine: MachineRef, key: str) -> list[WorkflowApprovalRow]:
        """Every approval request of the instance, oldest first."""
        return await self.store.approvals(self.machine(machine).name, key)

    async def counts(self, machine: MachineRef, *, cap: int | None = None) -> dict[tuple[str, str], int]:
        """How many instances are in each (state, status).

        With ``cap``, a count stops at ``cap + 1`` (read: more than ``cap``), so
        the read stays bounded on a machine with very many instances.

        :raises ConfigurationError: ``cap`` is below 1.
        """
        if cap is not None and cap < 1:
            raise ConfigurationError(f"cap must be at least 1, got {cap}")
        return await self.store.counts(self.machine(machine).name, cap)

    # -- the world talks back -------------------------------------------------------

    async def signal(
        self,
        machine: MachineRef,
        key: str,
        name: str,
        payload: Any = None,
        *,
        id: str | None = None,
        run_id: int | None = None,
    ) -> bool:
        """Send a durable signal to the live run of an instance; False when ``id`` was already
        used in this run for this name.

        Kept until a visit of that run reads it with ``ctx.signal(name)``; an
        instance waiting in a state with ``wake_on=name`` is woken at once. A
        signal belongs to one run: a later run never reads it, and may reuse its
        ``id``. Pass the ``run_id`` the callback was made for (``ctx.run_id``)
        so a late callback is refused rather than taken by a newer run.

        :raises UnknownInstance: the instance (or run ``run_id``) does not exist.
        :raises RunEnded: the run is over; nothing is stored.
        """
        m = self.machine(machine)
        if not isinstance(name, str) or not name or "\x00" in name:
            raise ConfigurationError(f"a signal name is a non-empty str without NUL, not {name!r}")
        wake = [s.name for s in m.states.values() if name in s.wake_on]
        wake += [old for old, new in m.renamed.items() if new in wake]  # instances not yet moved on
        data = msgspec.json.encode(payload)
        result = await self.store.signal(m.name, key, name, data, id, wake, run_id)
        if result == "missing":
            run = "" if run_id is None else f" run {run_id}"
            raise UnknownInstance(f"machine {m.name!r} has no instance {key!r}{run}: signal {name!r} refused")
        if result == "ended":
            raise RunEnded(f"{m.name}/{key}: the run is over; signal {name!r} was not stored")
        return result == "sent"

    async def approve(self, approval_id: int, *, by: str, reason: str | None = None) -> WorkflowApprovalRow:
        """Approve a pending request (single use, before it expires); the instance runs the state."""
        return await self._decide(approval_id, "approved", by, reason)

    async def deny(self, approval_id: int, *, by: str, reason: str | None = None) -> WorkflowApprovalRow:
        """Deny a pending request; the instance takes the approval's ``on_deny`` edge."""
        return await self._decide(approval_id, "denied", by, reason)

    async def _decide(
        self, approval_id: int, status: str, by: str, reason: str | None
    ) -> WorkflowApprovalRow:
        if not by:
            raise ConfigurationError("say who decides: by=...")
        if "\x00" in by or "\x00" in (reason or ""):
            raise ConfigurationError("who decides and why cannot contain NUL characters")
        decided = await self.store.decide(approval_id, status, by, reason)
        if decided is not None:
            return decided
        row = await self.store.approval(approval_id)
        if row is None:
            raise UnknownApproval(f"no approval {approval_id}")
        state = "expired" if row.status == "pending" else row.status
        raise GuardMismatch(f"approval {approval_id} is {state}, not pending: a decision is made once")

    # -- operating ----------------------------------------------------------------

    async def _commit(self, t: WorkflowTransition) -> int:
        version = await self.store.commit(t)
        if version is None:
            raise GuardMismatch(f"{t.machine}/{t.key} moved on while this ran; nothing was changed")
        return version

    async def repoint(
        self,
        machine: MachineRef,
        key: str,
        *,
        to: str,
        reason: str,
        by: str = "operator",
        expect: str | None = None,
    ) -> int:
        """Move an instance to ``to`` (guarded by ``expect``), fencing any visit in flight; audited."""
        m = self.machine(machine)
        _decide.check_target(m, to)
        facts = await self._facts(m, key)
        return await self._commit(
            _decide.repoint(m, facts, to=to, reason=reason, by=_operator(by), expect=expect)
        )

    async def cancel(
        self, machine: MachineRef, key: str, *, by: str = "operator", reason: str | None = None
    ) -> int:
        """End a live run in ``CANCELLED`` (no compensation runs)."""
        m = self.machine(machine)
        facts = await self._facts(m, key)
        return await self._commit(_decide.cancel(m, facts, by=_operator(by), reason=reason))

    async def pause(
        self, machine: MachineRef, key: str, *, by: str = "operator", reason: str | None = None
    ) -> int:
        """Stop running visits (a visit in flight is fenced) until :meth:`resume`."""
        m = self.machine(machine)
        facts = await self._facts(m, key)
        return await self._commit(_decide.pause(m, facts, by=_operator(by), reason=reason))

    async def resume(
        self, machine: MachineRef, key: str, *, by: str = "operator", reason: str | None = None
    ) -> int:
        """Continue a paused instance: its current state is visited again at once."""
        m = self.machine(machine)
        facts = await self._facts(m, key)
        return await self._commit(_decide.resume(m, facts, by=_operator(by), reason=reason))

    async def resolve(
        self, machine: MachineRef, key: str, *, outcome: str, by: str, reason: str | None = None
    ) -> int:
        """Record a human's choice for an ``uncertain`` instance and continue.

        ``outcome``: ``succeeded`` (take the success edge), ``failed`` (the
        failure edge), ``retry`` (visit the state again) or ``compensate``
        (undo the run's effects, then ``FAILED``).
        """
        _decide.check_resolution(outcome)
        m = self.machine(machine)
        facts = await self._facts(m, key)
        return await self._commit(_decide.resolve(m, facts, outcome=outcome, by=_operator(by), reason=reason))

    async def sweep(self, machine: MachineRef | None = None, *, grace_seconds: float | None = None) -> int:
        """Re-publish a step for instances whose tick was lost; return how many.

        Also runs by itself: on the first step a process handles and then every
        ``sweep_interval`` on the step path, and when a run starts.
        """
        machines = [self.machine(machine)] if machine is not None else list(self.machines.values())
        total = 0
        for m in machines:
            grace = m.sweep_grace if grace_seconds is None else grace_seconds
            total += await self.store.sweep(m.name, grace)
        return total

    async def check(self, machine: MachineRef) -> list[str]:
        """Problems of live instances against the definition: states that no longer exist, not renamed."""
        return (await self.changes(machine)).problems

    async def changes(self, machine: MachineRef) -> DefinitionReport:
        """The machine's table in the code against the one in force, and the live instances it touches.

        The table in force is the one the last worker to start recorded; a
        report made before the new code's workers start (``eventbus workflow
        check`` at deploy time) lists what the deploy changes.
        """
        m = self.machine(machine)
        stored = await self.store.definition(m.name)
        return report(m, stored, await self.store.counts(m.name))

    async def record_definitions(self, machines: Sequence[str] | None = None) -> list[DefinitionReport]:
        """Report each machine's table change, then record its table as the one in force.

        A worker does this when it starts. The report is a logged warning when
        the change touches live instances or instances sit in states that are
        gone; otherwise (nothing live touched, instances only in renamed
        states) it is logged at info level.
        """
        reports = []
        for name in self.machines if machines is None else machines:
            m = self.machine(name)
            found = await self.changes(m)
            lines = found.lines()
            if found.problems or (found.changed and found.live):
                log.warning("%s", "\n".join(lines))
            elif lines:
                log.info("%s (no live instance is touched)", "\n".join(lines))
            definition = msgspec.json.encode(m.definition(), order="sorted")
            await self.store.record_definition(m.name, found.def_hash, definition)
            reports.append(found)
        return reports
