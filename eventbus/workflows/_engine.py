"""One visit of one state, as one delivery of the machine's step event.

The step handler reads the pointer, refuses a step whose version is not the
current one (stale, duplicated or reordered: a no-op), runs the state
function once with no transaction open, and commits the outcome as one
guarded :class:`~eventbus.backends.base.WorkflowTransition`. Nothing is
replayed and nothing recurses: the next visit is the next delivery.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ..backends.base import (
    WorkflowApprovalRequest,
    WorkflowHistoryEntry,
    WorkflowStore,
    WorkflowTransition,
)
from ..context import Context
from ..errors import CheckpointTooLarge, ConfigurationError
from ..types import WorkflowApprovalRow, WorkflowInstance
from ._commits import LoadQueue
from ._context import StepContext
from ._machine import (
    COMPENSATING,
    FAILED,
    MAX_RETRIES,
    UNCERTAIN,
    Machine,
    State,
    StepEvent,
    seconds,
)
from ._outcomes import Fail, Goto, Uncertain, Yield

if TYPE_CHECKING:
    from ..bus import Bus

__all__ = ["ACTIVE", "Engine", "Move"]

log = logging.getLogger("eventbus.workflows")

ACTIVE = frozenset({"pending", "running", "waiting", "waiting_approval"})
"""Statuses in which a step event runs a visit."""


@dataclass(frozen=True)
class Move:
    """Where a transition leads, before it is written."""

    state: str
    status: str
    step: str | None
    delay: float = 0.0
    next_run_in: float | None = None
    compensate_to: str | None = None


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


class Engine:
    """Runs the visits of one machine on one bus."""

    def __init__(self, bus: Bus, machine: Machine[Any]) -> None:
        self.bus = bus
        self.m = machine
        self.actor = f"worker:{socket.gethostname()}:{os.getpid()}"
        self._swept_at = -float("inf")
        self.loads = LoadQueue(bus.backend.workflows, machine.name)

    @property
    def store(self) -> WorkflowStore:
        return self.bus.backend.workflows

    # -- the step handler ---------------------------------------------------------

    async def handle(self, step: StepEvent, ctx: Context) -> None:
        """The machine's subscription handler: one visit, or a no-op for a stale step."""
        await self.maybe_sweep()
        inst = await self.loads.load(step.key)
        if inst is None or inst.version != step.version or inst.status not in ACTIVE:
            return
        t = await self.visit(inst, ctx)
        if t is not None and await self.bus.workflow_commits.commit(t) is None:
            log.info("visit of %s/%s at version %s was fenced", self.m.name, step.key, step.version)

    async def visit(self, inst: WorkflowInstance, ctx: Context | None) -> WorkflowTransition | None:
        if inst.state == COMPENSATING:
            return await self._compensate(inst, ctx)
        state = self.m.lookup(inst.state)
        if state is None:
            error = f"state {inst.state} is not in the table of {self.m.name!r}"
            return await self.transition(
                inst, FAILED, self._entry(inst, "error", ctx), ctx, error=("unknown-state", error)
            )
        cap = self._cap(inst, state)
        if cap is not None:
            entry = self._entry(inst, "cap", ctx, reason=cap)
            return await self.transition(inst, MAX_RETRIES, entry, ctx, error=("max-retries", cap))
        checkpoint = self.m.decode(inst.checkpoint)
        approval = None
        if state.approval is not None:
            approval, gate = await self._approval_gate(inst, state, checkpoint, ctx)
            if approval is None:
                return gate
        return await self._run(inst, state, checkpoint, approval, ctx)

    def _cap(self, inst: WorkflowInstance, state: State) -> str | None:
        visits = inst.visits.get(state.name, 0)
        if state.max_visits is not None and visits >= state.max_visits:
            return f"max retries reached: {state.name} visited {visits} times"
        in_state = (inst.now - inst.state_entered_at).total_seconds()
        if state.max_age is not None and in_state > state.max_age:
            return f"max age reached: {state.name} for {in_state:.0f}s (max_age {state.max_age:.0f}s)"
        in_run = (inst.now - inst.run_started_at).total_seconds()
        limit = self.m.run_max_age
        if limit is not None and in_run > limit:
            return f"max age reached: run of {self.m.name} for {in_run:.0f}s (max_age {limit:.0f}s)"
        return None

    # -- running a state --------------------------------------------------------------

    async def _run(
        self,
        inst: WorkflowInstance,
        state: State,
        checkpoint: Any,
        approval: WorkflowApprovalRow | None,
        ctx: Context | None,
    ) -> WorkflowTransition:
        visit = inst.visits.get(state.name, 0) + 1
        signals = await self.store.signals(self.m.name, inst.key, True) if inst.has_signals else []
        attempt = ctx.attempt if ctx is not None else 1
        sctx = StepContext(inst, state.name, visit, signals, self.m.compensations, attempt, approval)
        started = time.time()
        try:
            outcome: Any = await state.fn(checkpoint, sctx)
            data = self.m.encode(checkpoint)
        except CheckpointTooLarge as exc:
            outcome, data = Fail("checkpoint-too-large", str(exc)), inst.checkpoint
        except Exception as exc:  # the state machine is the error boundary
            outcome, data = exc, inst.checkpoint
        target, kind, error = self._target(state, outcome)
        entry = self._entry(inst, kind, ctx, state=state.name, visit=visit, started=started, error=error)
        used = ((approval.id, "approved", "approved"),) if approval is not None else ()
        visits = {**inst.visits, state.name: visit}
        if kind == "yield" or (target == state.name and not state.continue_run):
            # A yield, or a failure edge back into a yield point: wait a poll, holding nothing.
            poll = (
                seconds(outcome.poll)
                if isinstance(outcome, Yield) and outcome.poll is not None
                else state.poll
            )
            move = Move(state.name, "waiting", "tick" if poll is not None else None, poll or 0.0, poll)
            entry = msgspec.structs.replace(entry, yielded=kind == "yield")
            return self._write(
                inst, move, entry, ctx, error=error, data=data, visits=visits, sctx=sctx,
                wake_on=state.wake_on, approvals=used,
            )  # fmt: skip
        return await self.transition(
            inst, target, entry, ctx, error=error, data=data, visits=visits, sctx=sctx, approvals=used
        )

    def _target(self, state: State, outcome: Any) -> tuple[str, str, tuple[str, str] | None]:
        """(next state, history outcome, (error code, error)) of a state's result."""
        if outcome is None:
            return state.on_success, "ok", None
        if isinstance(outcome, Yield):
            if state.continue_run:
                error = f"{state.name} returned Yield but is declared continue_run=True"
                return state.on_failure, "error", ("cannot-yield", error)
            return state.name, "yield", None
        if isinstance(outcome, Fail):
            return state.on_failure, "fail", (outcome.code, outcome.message or outcome.code)
        if isinstance(outcome, Goto):
            if outcome.state not in state.edges():
                error = f"Goto({outcome.state!r}) is not an edge of {state.name}: declare it in also="
                return state.on_failure, "error", ("undeclared-goto", error)
            return outcome.state, "goto", None
        if isinstance(outcome, Uncertain):
            return UNCERTAIN, "uncertain", ("uncertain", outcome.reason)
        if isinstance(outcome, BaseException):
            return state.on_failure, "error", (type(outcome).__name__, _error_text(outcome))
        error = f"{state.name} returned {type(outcome).__name__}, not None, Fail, Goto, Yield or Uncertain"
        return state.on_failure, "error", ("bad-return", error)

    # -- where a transition leads ----------------------------------------------------

    async def transition(
        self,
        inst: WorkflowInstance,
        target: str,
        entry: WorkflowHistoryEntry,
        ctx: Context | None,
        *,
        error: tuple[str, str] | None = None,
        data: bytes | None = None,
        visits: dict[str, int] | None = None,
        sctx: StepContext | None = None,
        approvals: tuple[tuple[int, str, str], ...] = (),
        step: str = "next",
    ) -> WorkflowTransition:
        move = await self._move_to(inst, target, bool(sctx and sctx.effects), step)
        return self._write(
            inst, move, entry, ctx, error=error, data=data, visits=visits, sctx=sctx, approvals=approvals
        )

    async def _move_to(self, inst: WorkflowInstance, target: str, new_effects: bool, step: str) -> Move:
        if target in self.m.states:
            return Move(target, "running", step, 0.0, 0.0)
        if target == UNCERTAIN:
            return Move(UNCERTAIN, "uncertain", None, compensate_to=inst.compensate_to)
        status = self.m.terminals[target]
        if status == "failed" and (new_effects or await self._has_effects(inst)):
            return Move(COMPENSATING, "running", "compensate", 0.0, 0.0, compensate_to=target)
        return Move(target, status, None)

    async def _has_effects(self, inst: WorkflowInstance) -> bool:
        effects = await self.store.effects(self.m.name, inst.key, inst.run_id)
        return any(e.status == "done" and e.compensation for e in effects)

    def _write(
        self,
        inst: WorkflowInstance,
        move: Move,
        entry: WorkflowHistoryEntry,
        ctx: Context | None,
        *,
        error: tuple[str, str] | None = None,
        data: bytes | None = None,
        visits: dict[str, int] | None = None,
        sctx: StepContext | None = None,
        approvals: tuple[tuple[int, str, str], ...] = (),
        wake_on: tuple[str, ...] = (),
        attempts: int = 0,
        approval_request: WorkflowApprovalRequest | None = None,
        effect_status: tuple[tuple[int, str], ...] = (),
    ) -> WorkflowTransition:
        code, text = error if error is not None else (inst.last_error_code, inst.last_error)
        return WorkflowTransition(
            machine=inst.machine, key=inst.key, expected_version=inst.version, run_id=inst.run_id,
            state=move.state, status=move.status, visits=visits if visits is not None else inst.visits,
            checkpoint=data if data is not None else inst.checkpoint, entered=move.state != inst.state,
            attempts=attempts, error_code=code, error=text,
            held_state=inst.state if move.state == UNCERTAIN and inst.state != UNCERTAIN else inst.held_state,
            compensate_to=move.compensate_to, step=move.step, step_delay=move.delay,
            next_run_in=move.next_run_in, wake_on=wake_on, history=entry,
            consume_signals=tuple(sctx.consumed) if sctx else (), effects=tuple(sctx.effects) if sctx else (),
            effect_status=effect_status, approval_request=approval_request, approval_updates=approvals,
            lease=(ctx.delivery_id, ctx.lease_token) if ctx is not None else None,
        )  # fmt: skip

    def _entry(
        self,
        inst: WorkflowInstance,
        outcome: str,
        ctx: Context | None,
        *,
        state: str | None = None,
        visit: int | None = None,
        started: float | None = None,
        error: tuple[str, str] | None = None,
        reason: str | None = None,
        actor: str | None = None,
    ) -> WorkflowHistoryEntry:
        name = state or inst.state
        return WorkflowHistoryEntry(
            state=name,
            visit=visit if visit is not None else inst.visits.get(name, 0),
            outcome=outcome,
            actor=actor or self.actor,
            error_code=error[0] if error else None,
            error=error[1] if error else None,
            reason=reason,
            delivery_id=ctx.delivery_id if ctx is not None else None,
            started_at=started,
        )

    # -- approvals ----------------------------------------------------------------------

    async def _approval_gate(
        self, inst: WorkflowInstance, state: State, checkpoint: Any, ctx: Context | None
    ) -> tuple[WorkflowApprovalRow | None, WorkflowTransition | None]:
        """(the approval to run under, None) or (None, the transition instead of running, or None)."""
        spec = state.approval
        assert spec is not None
        data = spec.input_of(checkpoint)
        digest = spec.hash_of(data)
        rows = [
            r
            for r in await self.store.approvals(self.m.name, inst.key)
            if r.run_id == inst.run_id and r.state == state.name and r.consumed_version is None
        ]
        for r in (r for r in rows if r.input_hash == digest):
            if r.status == "approved":
                return r, None
            if r.status == "denied":
                entry = self._entry(inst, "denied", ctx, reason=r.reason, actor=f"operator:{r.decided_by}")
                error = ("denied", f"denied by {r.decided_by}: {r.reason or ''}")
                used = ((r.id, "denied", "denied"),)
                return None, await self.transition(
                    inst, spec.on_deny, entry, ctx, error=error, approvals=used
                )
            if r.status == "pending" and r.expires_at <= inst.now:
                entry = self._entry(inst, "expired", ctx, reason=f"approval {r.id} expired")
                error = ("approval-expired", f"approval {r.id} expired")
                used = ((r.id, "pending", "expired"),)
                return None, await self.transition(
                    inst, spec.on_timeout, entry, ctx, error=error, approvals=used
                )
            if r.status == "pending" and inst.status == "waiting_approval":
                return None, None  # still waiting: an early or repeated wake-up writes nothing
            if r.status == "pending":  # resumed or repointed while the request is open: wait again
                left = (r.expires_at - inst.now).total_seconds()
                move = Move(state.name, "waiting_approval", "approval-timeout", left, left)
                return None, self._write(inst, move, self._entry(inst, "approval-wait", ctx), ctx)
        return None, self._request(inst, state, data, digest, rows, ctx)

    def _request(
        self,
        inst: WorkflowInstance,
        state: State,
        data: bytes,
        digest: str,
        rows: list[WorkflowApprovalRow],
        ctx: Context | None,
    ) -> WorkflowTransition:
        spec = state.approval
        assert spec is not None
        timeout = seconds(spec.timeout) or 0.0
        superseded = tuple((r.id, "pending", "superseded") for r in rows if r.status == "pending")
        move = Move(state.name, "waiting_approval", "approval-timeout", timeout, timeout)
        entry = self._entry(inst, "approval-requested", ctx, reason=f"input {digest[:16]}")
        request = WorkflowApprovalRequest(state.name, data, digest, timeout)
        return self._write(inst, move, entry, ctx, approvals=superseded, approval_request=request)

    # -- compensation ----------------------------------------------------------------------

    async def _compensate(self, inst: WorkflowInstance, ctx: Context | None) -> WorkflowTransition:
        """Undo the last uncompensated effect of the run; at the end, enter the failure terminal."""
        effects = await self.store.effects(self.m.name, inst.key, inst.run_id)
        todo = [e for e in effects if e.status == "done" and e.compensation]
        terminal = inst.compensate_to or FAILED
        visit = inst.visits.get(COMPENSATING, 0) + 1
        visits = {**inst.visits, COMPENSATING: visit}
        if not todo:
            entry = self._entry(inst, "compensated", ctx, visit=visit, reason="every effect compensated")
            return self._write(
                inst, Move(terminal, self.m.terminals[terminal], None), entry, ctx, visits=visits
            )
        effect = todo[-1]
        sctx = StepContext(inst, COMPENSATING, visit, [], self.m.compensations, ctx.attempt if ctx else 1)
        started = time.time()
        try:
            fn = self.m.compensations.get(effect.compensation or "")
            if fn is None:
                raise ConfigurationError(f"compensation {effect.compensation!r} is not registered")
            await fn(self.m.decode(inst.checkpoint), effect, sctx)
        except Exception as exc:
            return self._compensation_failed(inst, effect.id, exc, visit, started, ctx)
        entry = self._entry(
            inst, "compensate", ctx, visit=visit, started=started, reason=f"compensated {effect.kind}"
        )
        move = Move(COMPENSATING, "running", "next", 0.0, 0.0, compensate_to=terminal)
        return self._write(inst, move, entry, ctx, visits=visits, effect_status=((effect.id, "compensated"),))

    def _compensation_failed(
        self,
        inst: WorkflowInstance,
        effect_id: int,
        exc: Exception,
        visit: int,
        started: float,
        ctx: Context | None,
    ) -> WorkflowTransition:
        error = (type(exc).__name__, _error_text(exc))
        visits = {**inst.visits, COMPENSATING: visit}
        entry = self._entry(inst, "compensate-failed", ctx, visit=visit, started=started, error=error)
        attempts = inst.attempts + 1
        if attempts >= self.m.compensation_attempts:
            move = Move(UNCERTAIN, "uncertain", None, compensate_to=inst.compensate_to)
            return self._write(
                inst, move, entry, ctx, error=error, visits=visits, effect_status=((effect_id, "uncertain"),)
            )
        delay = min(60.0, self.m.compensation_retry_seconds * 2.0 ** (attempts - 1))
        move = Move(
            COMPENSATING, "running", f"retry{attempts}", delay, delay, compensate_to=inst.compensate_to
        )
        return self._write(inst, move, entry, ctx, error=error, visits=visits, attempts=attempts)

    # -- the sweep for lost ticks -------------------------------------------------------------

    async def maybe_sweep(self) -> None:
        """At most once per ``sweep_interval`` in this process (first at its first step):
        re-publish steps of instances whose tick was lost."""
        now = time.monotonic()
        if now - self._swept_at < self.m.sweep_interval:
            return
        self._swept_at = now
        found = await self.store.sweep(self.m.name, self.m.sweep_grace)
        if found:
            log.warning("re-published %d lost steps of %s", found, self.m.name)
