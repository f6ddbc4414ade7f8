"""The state-machine operations of :class:`~eventbus.Bus`: start, inspect, signal, decide, operate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from ..context import Context
from ..errors import (
    ConfigurationError,
    DuplicateSubscription,
    GuardMismatch,
    UndeclaredState,
    UnknownApproval,
    UnknownInstance,
    UnknownMachine,
)
from ..retry import RetryPolicy
from ..router import Router, Subscription
from ..types import (
    WorkflowApprovalRow,
    WorkflowHistoryRow,
    WorkflowInstance,
    WorkflowSignalRow,
    WorkflowStatus,
)
from ._commits import CommitQueue
from ._engine import ACTIVE, Engine, Move
from ._machine import COMPENSATING, Machine, StartEvent

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..backends.base import Backend, WorkflowTransition

__all__ = ["Instance", "WorkflowBus", "WorkflowRun"]

C = TypeVar("C")
_RESOLUTIONS = ("succeeded", "failed", "retry", "compensate")
_STEP_RETRY = RetryPolicy(max_attempts=20, base_delay_seconds=0.5, max_delay_seconds=30.0)


@dataclass(frozen=True)
class WorkflowRun:
    """What :meth:`WorkflowBus.start` did: ``started`` is False when a live run was already there."""

    machine: str
    key: str
    run_id: int
    version: int
    status: WorkflowStatus
    started: bool


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

    @classmethod
    def of(cls, m: Machine[Any], row: WorkflowInstance) -> Instance[Any]:
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
        )


class WorkflowBus(Router):
    """Machines included with ``bus.include(machine)`` and the operations on their instances."""

    backend: Backend

    if TYPE_CHECKING:

        async def register(self, names: Sequence[str] | None = None) -> dict[str, int]: ...

    def __init__(self) -> None:
        super().__init__()
        self.machines: dict[str, Machine[Any]] = {}
        self._engines: dict[str, Engine] = {}
        self._registered: set[str] = set()
        self._commits: CommitQueue | None = None

    @property
    def workflow_commits(self) -> CommitQueue:
        """The group commit of this bus's visits (created on first use)."""
        if self._commits is None:
            self._commits = CommitQueue(self.backend.workflows)
        return self._commits

    def include(self, router: Router | Machine[Any]) -> None:
        """Add a router's subscriptions, or a machine (checked, then given its step subscription).

        Including another bus includes its machines too, run on this bus.
        """
        if isinstance(router, WorkflowBus):
            steps = {f"wf.{name}" for name in router.machines} | {f"wf.{n}.start" for n in router.machines}
            for sub in router.subscriptions.values():
                if sub.name not in steps:
                    self.add(sub)
            for m in router.machines.values():
                self.include(m)
            return
        if not isinstance(router, Machine):
            super().include(router)
            return
        router.check()
        if router.name in self.machines:
            raise DuplicateSubscription(f"a machine named {router.name!r} is already included")
        engine = Engine(self, router)  # type: ignore[arg-type]
        self.add(
            Subscription(
                name=f"wf.{router.name}",
                event_class=router.step_class,
                handler=engine.handle,
                retry=_STEP_RETRY,
                lease_seconds=router.lease_seconds,
                ordered=True,
            )
        )
        self.add(
            Subscription(
                name=f"wf.{router.name}.start",
                event_class=router.start_class,
                handler=self._scheduled_start(router),
                retry=_STEP_RETRY,
            )
        )
        self.machines[router.name] = router
        self._engines[router.name] = engine

    def _scheduled_start(self, m: Machine[Any]) -> Callable[[StartEvent, Context], Awaitable[None]]:
        """The handler of a machine's start events (fired by schedules): start a run."""

        async def start(event: StartEvent, ctx: Context) -> None:
            await self.start(m, m.decode(event.checkpoint.encode()))

        return start

    def machine(self, machine: Machine[Any] | str) -> Machine[Any]:
        name = machine if isinstance(machine, str) else machine.name
        found = self.machines.get(name)
        if found is None:
            raise UnknownMachine(f"no machine named {name!r} is included in this bus")
        return found

    # -- starting and reading --------------------------------------------------

    async def start(self, machine: Machine[Any] | str, checkpoint: Any) -> WorkflowRun:
        """Start a run for the checkpoint's key; idempotent while a run of that key is live."""
        m = self.machine(machine)
        if not isinstance(checkpoint, m.checkpoint):
            raise ConfigurationError(f"{m.name!r} takes a {m.checkpoint.__qualname__} checkpoint")
        key = m.key(checkpoint)
        if not isinstance(key, str) or not key or len(key) > 200:
            raise ConfigurationError(
                f"invalid instance key {key!r}: a non-empty string of at most 200 characters"
            )
        data = m.encode(checkpoint)
        name = f"wf.{m.name}"
        if name not in self._registered:
            await self.register([name])  # so the first step fans out even before any worker ran
            self._registered.add(name)
        inst, started = await self.backend.workflows.start(m.name, key, m.initial.name, data)
        await self._engines[m.name].maybe_sweep()
        return WorkflowRun(m.name, key, inst.run_id, inst.version, inst.status, started)

    async def _load(self, m: Machine[Any], key: str) -> WorkflowInstance:
        row = await self.backend.workflows.load(m.name, key)
        if row is None:
            raise UnknownInstance(f"machine {m.name!r} has no instance {key!r}")
        return row

    async def instance(self, machine: Machine[Any] | str, key: str) -> Instance[Any]:
        """The instance's pointer, read from the database; :class:`UnknownInstance` if absent."""
        m = self.machine(machine)
        return Instance.of(m, await self._load(m, key))

    async def instances(
        self,
        machine: Machine[Any] | str,
        *,
        status: str | None = None,
        state: str | None = None,
        limit: int = 1000,
    ) -> list[Instance[Any]]:
        m = self.machine(machine)
        return [Instance.of(m, r) for r in await self.backend.workflows.find(m.name, status, state, limit)]

    async def history(self, machine: Machine[Any] | str, key: str) -> list[WorkflowHistoryRow]:
        """One row per visit or operator action, in order."""
        return await self.backend.workflows.history(self.machine(machine).name, key)

    async def signals(
        self, machine: Machine[Any] | str, key: str, *, open_only: bool = False
    ) -> list[WorkflowSignalRow]:
        return await self.backend.workflows.signals(self.machine(machine).name, key, open_only)

    async def approvals(self, machine: Machine[Any] | str, key: str) -> list[WorkflowApprovalRow]:
        return await self.backend.workflows.approvals(self.machine(machine).name, key)

    async def workflow_counts(self, machine: Machine[Any] | str) -> dict[tuple[str, str], int]:
        return await self.backend.workflows.counts(self.machine(machine).name)

    # -- the world talks back -------------------------------------------------------

    async def signal(
        self, machine: Machine[Any] | str, key: str, name: str, payload: Any = None, *, id: str | None = None
    ) -> bool:
        """Send a durable signal; False when ``id`` was already used for this instance and name.

        Kept until a visit reads it with ``ctx.signal(name)``; an instance
        waiting in a state with ``wake_on=name`` is woken at once.
        """
        m = self.machine(machine)
        wake = [s.name for s in m.states.values() if name in s.wake_on]
        data = msgspec.json.encode(payload)
        return await self.backend.workflows.signal(m.name, key, name, data, id, wake)

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
        decided = await self.backend.workflows.decide(approval_id, status, by, reason)
        if decided is not None:
            return decided
        row = await self.backend.workflows.approval(approval_id)
        if row is None:
            raise UnknownApproval(f"no approval {approval_id}")
        state = "expired" if row.status == "pending" else row.status
        raise GuardMismatch(f"approval {approval_id} is {state}, not pending: a decision is made once")

    # -- operating ----------------------------------------------------------------

    async def _commit(self, t: WorkflowTransition) -> int:
        version = await self.backend.workflows.commit(t)
        if version is None:
            raise GuardMismatch(f"{t.machine}/{t.key} moved on while this ran; nothing was changed")
        return version

    async def repoint(
        self,
        machine: Machine[Any] | str,
        key: str,
        *,
        to: str,
        reason: str,
        by: str = "operator",
        expect: str | None = None,
    ) -> int:
        """Move an instance to ``to`` (guarded by ``expect``), fencing any visit in flight; audited."""
        m = self.machine(machine)
        if to not in m.states and to not in m.terminals:
            raise UndeclaredState(f"machine {m.name!r} has no state {to!r}")
        inst = await self._load(m, key)
        if expect is not None and inst.state != expect:
            raise GuardMismatch(f"{m.name}/{key} is in {inst.state}, not {expect}")
        engine = self._engines[m.name]
        entry = engine._entry(inst, "repoint", None, reason=reason, actor=f"operator:{by}")
        return await self._commit(await engine.transition(inst, to, entry, None, step="repoint"))

    async def cancel_instance(
        self, machine: Machine[Any] | str, key: str, *, by: str = "operator", reason: str | None = None
    ) -> int:
        """End a live run in ``CANCELLED`` (no compensation runs)."""
        return await self._operate(machine, key, "cancel", by, reason)

    async def pause(
        self, machine: Machine[Any] | str, key: str, *, by: str = "operator", reason: str | None = None
    ) -> int:
        """Stop running visits (a visit in flight is fenced) until :meth:`resume`."""
        return await self._operate(machine, key, "pause", by, reason)

    async def resume(
        self, machine: Machine[Any] | str, key: str, *, by: str = "operator", reason: str | None = None
    ) -> int:
        """Continue a paused instance: its current state is visited again at once."""
        return await self._operate(machine, key, "resume", by, reason)

    async def _operate(
        self, machine: Machine[Any] | str, key: str, action: str, by: str, reason: str | None
    ) -> int:
        m = self.machine(machine)
        inst = await self._load(m, key)
        allowed = {"cancel": ACTIVE | {"paused", "uncertain"}, "pause": ACTIVE, "resume": {"paused"}}[action]
        if inst.status not in allowed:
            raise GuardMismatch(f"{m.name}/{key} is {inst.status}: cannot {action}")
        engine = self._engines[m.name]
        entry = engine._entry(inst, action, None, reason=reason, actor=f"operator:{by}")
        if action == "cancel":
            return await self._commit(await engine.transition(inst, "CANCELLED", entry, None))
        move = (
            Move(inst.state, "paused", None)
            if action == "pause"
            else Move(inst.state, "running", "resume", 0.0, 0.0)
        )
        move = Move(move.state, move.status, move.step, move.delay, move.next_run_in, inst.compensate_to)
        return await self._commit(engine._write(inst, move, entry, None))

    async def resolve(
        self, machine: Machine[Any] | str, key: str, *, outcome: str, by: str, reason: str | None = None
    ) -> int:
        """Record a human's choice for an ``uncertain`` instance and continue.

        ``outcome``: ``succeeded`` (take the success edge), ``failed`` (the
        failure edge), ``retry`` (visit the state again) or ``compensate``
        (undo the run's effects, then ``FAILED``).
        """
        if outcome not in _RESOLUTIONS:
            raise ConfigurationError(f"resolve as one of {', '.join(_RESOLUTIONS)}, not {outcome!r}")
        m = self.machine(machine)
        inst = await self._load(m, key)
        if inst.status != "uncertain":
            raise GuardMismatch(f"{m.name}/{key} is {inst.status}, not uncertain")
        engine = self._engines[m.name]
        entry = engine._entry(
            inst, "resolve", None, reason=f"{outcome}: {reason or ''}".strip(), actor=f"operator:{by}"
        )
        if inst.held_state == COMPENSATING:
            return await self._commit(await self._resolve_compensation(engine, inst, outcome, entry))
        held = m.states.get(inst.held_state or "")
        if held is None:
            raise GuardMismatch(f"{m.name}/{key} holds no state to resume ({inst.held_state!r})")
        if outcome == "retry":
            move = Move(held.name, "running", "resolve", 0.0, 0.0)
            return await self._commit(engine._write(inst, move, entry, None))
        target = {"succeeded": held.on_success, "failed": held.on_failure, "compensate": "FAILED"}[outcome]
        return await self._commit(await engine.transition(inst, target, entry, None, step="resolve"))

    async def _resolve_compensation(
        self, engine: Engine, inst: WorkflowInstance, outcome: str, entry: Any
    ) -> WorkflowTransition:
        effects = await self.backend.workflows.effects(inst.machine, inst.key, inst.run_id)
        stuck = tuple(e.id for e in effects if e.status == "uncertain")
        terminal = inst.compensate_to or "FAILED"
        if outcome == "failed":
            return engine._write(inst, Move(terminal, engine.m.terminals[terminal], None), entry, None)
        status = "compensated" if outcome == "succeeded" else "done"
        move = Move(COMPENSATING, "running", "resolve", 0.0, 0.0, compensate_to=terminal)
        return engine._write(inst, move, entry, None, effect_status=tuple((i, status) for i in stuck))

    async def sweep_workflows(
        self, machine: Machine[Any] | str | None = None, *, grace_seconds: float | None = None
    ) -> int:
        """Re-publish a step for instances whose tick was lost; return how many.

        Also runs by itself: on the first step a process handles and then every
        ``sweep_interval`` on the step path, and when a run starts.
        """
        machines = [self.machine(machine)] if machine is not None else list(self.machines.values())
        total = 0
        for m in machines:
            grace = m.sweep_grace if grace_seconds is None else grace_seconds
            total += await self.backend.workflows.sweep(m.name, grace)
        return total

    async def workflow_check(self, machine: Machine[Any] | str) -> list[str]:
        """Problems of live instances against the definition (states that no longer exist)."""
        m = self.machine(machine)
        problems = []
        for (state, status), n in sorted((await self.backend.workflows.counts(m.name)).items()):
            if (
                status in ACTIVE | {"paused", "uncertain"}
                and not m.is_state(state)
                and state not in m.renamed
            ):
                problems.append(
                    f"{n} {status} instance(s) of {m.name} are in {state}, which the table no longer has "
                    f"(declare renamed={{{state!r}: 'NEW'}} or repoint them)"
                )
        return problems
