"""The decide step: facts and an outcome in, one transition out, with no I/O.

A visit reads its :class:`~eventbus.backends.base.WorkflowFacts` once, then
:func:`plan` says what to do before anything runs: run the state (under the
approval it needs), run one compensation, or write a transition at once (a
cap reached, an approval denied or expired, a request to make). After the
state or compensation ran, :func:`decide` turns what it produced into the
transition to commit. The operator moves (:func:`repoint`, :func:`pause`,
:func:`resume`, :func:`cancel`, :func:`resolve`) are built from the same
functions, so a visit and an operator write the same shape.

A new outcome is one ``case`` in :func:`_target` plus its history kind.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec

from ..backends.base import (
    ALL_CHILDREN,
    WorkflowApprovalRequest,
    WorkflowEffect,
    WorkflowFacts,
    WorkflowHistoryEntry,
    WorkflowStart,
    WorkflowTransition,
)
from ..errors import ConfigurationError, DecodeError, GuardMismatch, InvalidOutcome, UndeclaredState
from ..types import WorkflowApprovalRow, WorkflowEffectRow, WorkflowInstance
from ._machine import COMPENSATING, FAILED, MAX_RETRIES, UNCERTAIN, Machine, State
from ._outcomes import Fail, Goto, Uncertain, Yield, seconds

__all__ = [
    "ACTIVE",
    "LIVE",
    "RESOLUTIONS",
    "Compensated",
    "Plan",
    "Ran",
    "RunCompensation",
    "RunState",
    "TimedOut",
    "Writer",
    "cancel",
    "check_resolution",
    "check_target",
    "decide",
    "pause",
    "plan",
    "repoint",
    "resolve",
    "resume",
]

ACTIVE = frozenset({"pending", "running", "waiting", "waiting_approval"})
"""Statuses in which a step event runs a visit."""
LIVE = ACTIVE | {"paused", "uncertain"}
"""Statuses of a run that has not ended."""
RESOLUTIONS = ("succeeded", "failed", "retry", "compensate")
"""The choices a human makes for an ``uncertain`` instance."""

Error = tuple[str, str]
"""(error code, error text) recorded on the pointer and in the history."""


@dataclass(frozen=True)
class Writer:
    """Who writes a transition: the actor in the history and, for a visit, its delivery's lease."""

    actor: str
    delivery_id: int | None = None
    lease_token: str | None = None
    woken_by: str | None = None
    """What woke the visit (see :mod:`._wake`); None for an operator."""

    @property
    def lease(self) -> tuple[int, str] | None:
        """(delivery id, lease token) fencing the commit, for a visit."""
        if self.delivery_id is None or self.lease_token is None:
            return None
        return self.delivery_id, self.lease_token


@dataclass(frozen=True)
class Move:
    """Where a transition leads, before it is written."""

    state: str
    status: str
    step: str | None
    delay: float = 0.0
    next_run_in: float | None = None
    compensate_to: str | None = None


@dataclass(frozen=True)
class Writes:
    """What a transition writes beside the move of the pointer."""

    error: Error | None = None
    checkpoint: bytes | None = None
    visits: dict[str, int] | None = None
    consume_signals: tuple[int, ...] = ()
    effects: tuple[WorkflowEffect, ...] = ()
    effect_status: tuple[tuple[int, str], ...] = ()
    approvals: tuple[tuple[int, str, str], ...] = ()
    approval_request: WorkflowApprovalRequest | None = None
    wake_on: tuple[str, ...] = ()
    attempts: int = 0
    starts: tuple[WorkflowStart, ...] = ()
    children_wait: int | None = None


@dataclass(frozen=True)
class RunState:
    """Run the state function of ``state`` (visit number ``visit``) on ``checkpoint``."""

    state: State
    visit: int
    checkpoint: Any
    approval: WorkflowApprovalRow | None = None


@dataclass(frozen=True)
class RunCompensation:
    """Run the compensation of ``effect`` (the newest one not yet undone)."""

    effect: WorkflowEffectRow
    visit: int


@dataclass(frozen=True)
class TimedOut:
    """The result of a state function cancelled at its ``timeout_seconds``."""

    seconds: float


Plan = RunState | RunCompensation | WorkflowTransition | None
"""What a visit does: run something, write a transition at once, or nothing."""


@dataclass(frozen=True)
class Ran:
    """What running a state produced: its result (None, an outcome or the exception raised)."""

    run: RunState
    result: object
    checkpoint: bytes | None
    """The checkpoint as the state left it, encoded; None keeps the one read."""
    started: float | None
    """Epoch seconds when it started; None when it failed before it ran (the commit time is recorded)."""
    consumed: tuple[int, ...] = ()
    effects: tuple[WorkflowEffect, ...] = ()
    starts: tuple[WorkflowStart, ...] = ()
    """Child runs the state started; dropped when it raised, timed out or returned something invalid."""


@dataclass(frozen=True)
class Compensated:
    """What running a compensation produced: nothing, or the exception it raised."""

    run: RunCompensation
    error: Exception | None
    started: float


def _error_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ fails still fails its visit, with its type
        text = "(its message cannot be read)"
    return f"{type(exc).__name__}: {text}"


def _clean(text: str | None) -> str | None:
    """Text as the history stores it: NUL (which PostgreSQL refuses) made visible, at most 4000 characters."""
    return None if text is None else text.replace("\x00", "\\x00")[:4000]


# -- the shape every transition is written in ----------------------------------------------


def _entry(
    inst: WorkflowInstance,
    outcome: str,
    by: Writer,
    *,
    state: str | None = None,
    visit: int | None = None,
    started: float | None = None,
    error: Error | None = None,
    reason: str | None = None,
) -> WorkflowHistoryEntry:
    name = state or inst.state
    return WorkflowHistoryEntry(
        state=name,
        visit=visit if visit is not None else inst.visits.get(name, 0),
        outcome=outcome,
        actor=by.actor,
        error_code=_clean(error[0]) if error else None,
        error=_clean(error[1]) if error else None,
        reason=_clean(reason),
        delivery_id=by.delivery_id,
        started_at=started,
        woken_by=by.woken_by,
    )


def _write(
    inst: WorkflowInstance, move: Move, entry: WorkflowHistoryEntry, by: Writer, w: Writes = Writes()
) -> WorkflowTransition:
    code, text = inst.last_error_code, inst.last_error
    if w.error is not None:
        code, text = _clean(w.error[0]), _clean(w.error[1])
    if move.status == "completed":  # a run that completes has no last error (its history keeps them)
        code, text = None, None
    return WorkflowTransition(
        machine=inst.machine, key=inst.key, expected_version=inst.version, run_id=inst.run_id,
        state=move.state, status=move.status, visits=w.visits if w.visits is not None else inst.visits,
        checkpoint=w.checkpoint if w.checkpoint is not None else inst.checkpoint,
        entered=move.state != inst.state, attempts=w.attempts, error_code=code, error=text,
        held_state=inst.state if move.state == UNCERTAIN and inst.state != UNCERTAIN else inst.held_state,
        compensate_to=move.compensate_to, step=move.step, step_delay=move.delay,
        next_run_in=move.next_run_in, wake_on=w.wake_on, history=entry,
        consume_signals=w.consume_signals, effects=w.effects, effect_status=w.effect_status,
        approval_request=w.approval_request, approval_updates=w.approvals, lease=by.lease,
        starts=w.starts, children_wait=w.children_wait,
    )  # fmt: skip


def _has_effects(facts: WorkflowFacts) -> bool:
    return any(e.status == "done" and e.compensation for e in facts.effects)


def _move_to(m: Machine[Any], facts: WorkflowFacts, target: str, new_effects: bool, step: str) -> Move:
    """A state runs next; UNCERTAIN holds; a failure terminal compensates the run's effects first."""
    inst = facts.instance
    if target in m.states:
        return Move(target, "running", step, 0.0, 0.0)
    if target == UNCERTAIN:
        return Move(UNCERTAIN, "uncertain", None, compensate_to=inst.compensate_to)
    status = m.terminals[target]
    if status == "failed" and (new_effects or _has_effects(facts)):
        return Move(COMPENSATING, "running", "compensate", 0.0, 0.0, compensate_to=target)
    return Move(target, status, None)


def _transition(
    m: Machine[Any],
    facts: WorkflowFacts,
    target: str,
    entry: WorkflowHistoryEntry,
    by: Writer,
    w: Writes = Writes(),
    step: str = "next",
) -> WorkflowTransition:
    move = _move_to(m, facts, target, bool(w.effects), step)
    return _write(facts.instance, move, entry, by, _closing(facts, target, w))


def _closing(facts: WorkflowFacts, target: str, w: Writes) -> Writes:
    """Leaving a state closes its open approvals: a decision is used only by the visit that asked.

    A pending request is superseded whether or not it was approved meanwhile
    (each guard is tried; the one matching the row at commit applies), so a
    decision made while the instance was elsewhere never runs a later visit.
    """
    inst = facts.instance
    if target == inst.state:
        return w
    taken = {update[0] for update in w.approvals}
    rows = [
        r
        for r in facts.approvals
        if r.state == inst.state and r.run_id == inst.run_id and r.consumed_version is None
        and r.id not in taken
    ]  # fmt: skip
    close = _supersede(rows)
    return replace(w, approvals=w.approvals + close) if close else w


def _supersede(rows: list[WorkflowApprovalRow]) -> tuple[tuple[int, str, str], ...]:
    """Updates closing the open ``rows``; a pending one is closed even if approved meanwhile."""
    return tuple(
        (r.id, status, "superseded")
        for r in rows
        if r.status in ("pending", "approved")
        for status in (("pending", "approved") if r.status == "pending" else ("approved",))
    )


# -- before anything runs -----------------------------------------------------------------


def plan(m: Machine[Any], facts: WorkflowFacts, by: Writer) -> Plan:
    """What a visit of the instance in ``facts`` does, before anything runs."""
    inst = facts.instance
    if inst.state == COMPENSATING:
        return _plan_compensation(m, facts, by)
    state = m.lookup(inst.state)
    if state is None:
        error = ("unknown-state", f"state {inst.state} is not in the table of {m.name!r}")
        return _transition(m, facts, FAILED, _entry(inst, "error", by), by, Writes(error=error))
    cap = _cap(m, inst, state)
    if cap is not None:
        entry = _entry(inst, "cap", by, reason=cap)
        return _transition(m, facts, MAX_RETRIES, entry, by, Writes(error=("max-retries", cap)))
    try:
        checkpoint = m.decode(inst.checkpoint)
    except DecodeError as exc:  # no state can run on it: the run fails, the error in its history
        error = ("checkpoint-undecodable", str(exc))
        return _transition(m, facts, FAILED, _entry(inst, "error", by, error=error), by, Writes(error=error))
    run = RunState(state, inst.visits.get(state.name, 0) + 1, checkpoint)
    return run if state.approval is None else _approval_gate(m, facts, run, by)


def _cap(m: Machine[Any], inst: WorkflowInstance, state: State) -> str | None:
    visits = inst.visits.get(state.name, 0)
    if state.max_visits is not None and visits >= state.max_visits:
        return f"max retries reached: {state.name} visited {visits} times"
    in_state = (inst.now - inst.state_entered_at).total_seconds()
    if state.max_age is not None and in_state > state.max_age:
        return f"max age reached: {state.name} for {in_state:.0f}s (max_age {state.max_age:.0f}s)"
    in_run = (inst.now - inst.run_started_at).total_seconds()
    limit = m.run_max_age
    if limit is not None and in_run > limit:
        return f"max age reached: run of {m.name} for {in_run:.0f}s (max_age {limit:.0f}s)"
    return None


def _approval_gate(m: Machine[Any], facts: WorkflowFacts, run: RunState, by: Writer) -> Plan:
    """Run under the approval of this exact input, act on its decision, or (re)request one."""
    inst, state, spec = facts.instance, run.state, run.state.approval
    assert spec is not None
    try:
        data = spec.input_of(run.checkpoint)
    except Exception as exc:  # the approval's input function is the state's code: its failure edge
        return _decide_run(m, facts, Ran(run, exc, None, None), by)
    digest = spec.hash_of(data)
    rows = [
        r
        for r in facts.approvals
        if r.run_id == inst.run_id and r.state == state.name and r.consumed_version is None
    ]
    for r in (r for r in rows if r.input_hash == digest):
        if r.status in ("approved", "pending") and r.expires_at <= inst.now:
            return _decided(m, facts, run, r, by)  # a decision counts only before it expires
        if r.status == "approved":
            return RunState(state, run.visit, run.checkpoint, r)
        if r.status == "denied":
            return _decided(m, facts, run, r, by)
        if r.status == "pending" and inst.status == "waiting_approval":
            return None  # still waiting: an early or repeated wake-up writes nothing
        if r.status == "pending":  # resumed or repointed while the request is open: wait again
            left = (r.expires_at - inst.now).total_seconds()
            move = Move(state.name, "waiting_approval", "approval-timeout", left, left)
            return _write(inst, move, _entry(inst, "approval-wait", by), by)
    return _request(facts.instance, run, data, digest, rows, by)


def _decided(
    m: Machine[Any], facts: WorkflowFacts, run: RunState, r: WorkflowApprovalRow, by: Writer
) -> WorkflowTransition:
    """A denied or expired request: take the approval's ``on_deny`` or ``on_timeout`` edge.

    The round counts as a visit of the state, so ``max_visits`` caps a state
    whose timeout edge asks again. An approval that expired before its visit
    ran (the worker was down, or a crashed visit runs again) is expired too.
    """
    inst, state, spec = facts.instance, run.state, run.state.approval
    assert spec is not None
    visits = {**inst.visits, state.name: run.visit}
    if r.status == "denied":
        error = ("denied", f"denied by {r.decided_by}: {r.reason or ''}")
        entry = _entry(inst, "denied", by, visit=run.visit, error=error, reason=r.reason)
        entry = msgspec.structs.replace(entry, actor=f"operator:{r.decided_by}")
        w = Writes(error=error, visits=visits, approvals=((r.id, "denied", "denied"),))
        return _transition(m, facts, spec.on_deny, entry, by, w)
    text = f"approval {r.id} expired"
    if r.status == "approved":
        text += f" before its visit ran (approved by {r.decided_by})"
    entry = _entry(inst, "expired", by, visit=run.visit, error=("approval-expired", text), reason=text)
    w = Writes(error=("approval-expired", text), visits=visits, approvals=((r.id, r.status, "expired"),))
    return _transition(m, facts, spec.on_timeout, entry, by, w)


def _request(
    inst: WorkflowInstance,
    run: RunState,
    data: bytes,
    digest: str,
    rows: list[WorkflowApprovalRow],
    by: Writer,
) -> WorkflowTransition:
    """A new request for this input; open requests (and unused decisions) for other inputs are superseded."""
    state, spec = run.state, run.state.approval
    assert spec is not None
    timeout = seconds(spec.timeout) or 0.0
    superseded = _supersede(rows)
    move = Move(state.name, "waiting_approval", "approval-timeout", timeout, timeout)
    entry = _entry(inst, "approval-requested", by, visit=run.visit, reason=f"input {digest[:16]}")
    request = WorkflowApprovalRequest(state.name, data, digest, timeout)
    return _write(inst, move, entry, by, Writes(approvals=superseded, approval_request=request))


def _plan_compensation(m: Machine[Any], facts: WorkflowFacts, by: Writer) -> Plan:
    """Undo the newest effect not yet compensated; with none left, enter the failure terminal."""
    inst = facts.instance
    todo = [e for e in facts.effects if e.status == "done" and e.compensation]
    visit = inst.visits.get(COMPENSATING, 0) + 1
    if todo:
        return RunCompensation(todo[-1], visit)
    terminal = inst.compensate_to or FAILED
    entry = _entry(inst, "compensated", by, visit=visit, reason="every effect compensated")
    visits = {**inst.visits, COMPENSATING: visit}
    return _write(inst, Move(terminal, m.terminals[terminal], None), entry, by, Writes(visits=visits))


# -- after it ran ------------------------------------------------------------------------------


def decide(
    m: Machine[Any], facts: WorkflowFacts, outcome: Ran | Compensated, by: Writer
) -> WorkflowTransition:
    """The transition of a visit, from what its state (or compensation) produced."""
    match outcome:
        case Ran():
            return _decide_run(m, facts, outcome, by)
        case Compensated(error=None):
            return _compensated(facts.instance, outcome, by)
        case Compensated():
            return _compensation_failed(m, facts.instance, outcome, by)


def _target(state: State, result: object) -> tuple[str, str, Error | None]:
    """(next state, history outcome, error) of a state's result."""
    match result:
        case None:
            return state.on_success, "ok", None
        case Yield():
            if state.continue_run:
                error = f"{state.name} returned Yield but is declared continue_run=True"
                return state.on_failure, "error", ("cannot-yield", error)
            return state.name, "yield", None
        case Fail(code=code, message=message):
            return state.on_failure, "fail", (code, message or code)
        case Goto(state=target):
            if target not in state.edges():
                error = f"Goto({target!r}) is not an edge of {state.name}: declare it in also="
                return state.on_failure, "error", ("undeclared-goto", error)
            return target, "goto", None
        case Uncertain(reason=reason):
            return UNCERTAIN, "uncertain", ("uncertain", reason)
        case TimedOut(seconds=limit):
            error = f"{state.name} ran past its timeout of {limit:g}s"
            return state.on_failure, "timeout", ("timeout", error)
        case BaseException():
            return state.on_failure, "error", (type(result).__name__, _error_text(result))
    error = f"{state.name} returned {type(result).__name__}, not None, Fail, Goto, Yield or Uncertain"
    return state.on_failure, "error", ("bad-return", error)


def _children_wait(facts: WorkflowFacts, ran: Ran) -> int | InvalidOutcome | None:
    """The ``children_ended`` count a ``Yield(children=...)`` wakes at, or why it cannot wait."""
    if not isinstance(ran.result, Yield) or ran.result.children is None:
        return None
    wanted, inst = ran.result.children, facts.instance
    new = {(s.machine, s.key) for s in ran.starts}
    total = len(facts.children) + len(new)
    live = sum(1 for c in facts.children if c.status is None) + len(new)
    if wanted == "all":
        if total == 0:
            return InvalidOutcome("Yield(children='all') in a run that started no children")
        return ALL_CHILDREN
    count = 1 if wanted == "any" else int(wanted)
    if count > live:
        return InvalidOutcome(f"Yield(children={wanted!r}) waits on {count} children but {live} are live")
    return inst.children_ended + count


def _decide_run(m: Machine[Any], facts: WorkflowFacts, ran: Ran, by: Writer) -> WorkflowTransition:
    wait = _children_wait(facts, ran)
    if isinstance(wait, InvalidOutcome):  # a bad wait is the state's error: its failure edge
        ran = replace(ran, result=wait, starts=())
        wait = None
    inst, state, visit = facts.instance, ran.run.state, ran.run.visit
    target, kind, error = _target(state, ran.result)
    entry = _entry(inst, kind, by, state=state.name, visit=visit, started=ran.started, error=error)
    approval = ran.run.approval
    w = Writes(
        error=error,
        checkpoint=ran.checkpoint,
        visits={**inst.visits, state.name: visit},
        consume_signals=ran.consumed,
        effects=ran.effects,
        approvals=((approval.id, "approved", "approved"),) if approval is not None else (),
        starts=() if kind in ("error", "timeout") else ran.starts,  # a visit in error starts nothing
    )
    if kind == "yield" or (target == state.name and not state.continue_run):
        # A yield, or a failure edge back into a yield point: wait a poll, holding nothing.
        poll = _poll(state, ran.result)
        move = Move(state.name, "waiting", "tick" if poll is not None else None, poll or 0.0, poll)
        entry = msgspec.structs.replace(entry, yielded=kind == "yield")
        return _write(inst, move, entry, by, replace(w, wake_on=state.wake_on, children_wait=wait))
    return _transition(m, facts, target, entry, by, w)


def _poll(state: State, result: object) -> float | None:
    if isinstance(result, Yield) and result.poll is not None:
        return seconds(result.poll)
    if isinstance(result, Yield) and result.children is not None:
        return None  # the children's end wakes it; a poll here only when the Yield asks for one
    return state.poll


def _compensated(inst: WorkflowInstance, c: Compensated, by: Writer) -> WorkflowTransition:
    effect, visit = c.run.effect, c.run.visit
    entry = _entry(
        inst, "compensate", by, visit=visit, started=c.started, reason=f"compensated {effect.kind}"
    )
    move = Move(COMPENSATING, "running", "next", 0.0, 0.0, compensate_to=inst.compensate_to or FAILED)
    w = Writes(visits={**inst.visits, COMPENSATING: visit}, effect_status=((effect.id, "compensated"),))
    return _write(inst, move, entry, by, w)


def _compensation_failed(
    m: Machine[Any], inst: WorkflowInstance, c: Compensated, by: Writer
) -> WorkflowTransition:
    """Retry with backoff, up to the machine's ``compensation_attempts``; then UNCERTAIN."""
    assert c.error is not None
    error = (type(c.error).__name__, _error_text(c.error))
    visits = {**inst.visits, COMPENSATING: c.run.visit}
    entry = _entry(inst, "compensate-failed", by, visit=c.run.visit, started=c.started, error=error)
    attempts = inst.attempts + 1
    if attempts >= m.compensation_attempts:
        move = Move(UNCERTAIN, "uncertain", None, compensate_to=inst.compensate_to)
        w = Writes(error=error, visits=visits, effect_status=((c.run.effect.id, "uncertain"),))
        return _write(inst, move, entry, by, w)
    delay = min(60.0, m.compensation_retry_seconds * 2.0 ** (attempts - 1))
    move = Move(COMPENSATING, "running", f"retry{attempts}", delay, delay, compensate_to=inst.compensate_to)
    return _write(inst, move, entry, by, Writes(error=error, visits=visits, attempts=attempts))


# -- operator moves ---------------------------------------------------------------------------


def check_target(m: Machine[Any], to: str) -> None:
    """Refuse a repoint to a state the machine does not declare."""
    if to not in m.states and to not in m.terminals:
        raise UndeclaredState(f"machine {m.name!r} has no state {to!r}")


def check_resolution(outcome: str) -> None:
    """Refuse a resolution that is not one of :data:`RESOLUTIONS`."""
    if outcome not in RESOLUTIONS:
        raise ConfigurationError(f"resolve as one of {', '.join(RESOLUTIONS)}, not {outcome!r}")


def repoint(
    m: Machine[Any], facts: WorkflowFacts, *, to: str, reason: str, by: Writer, expect: str | None = None
) -> WorkflowTransition:
    """Move the instance to ``to`` (only from ``expect`` when given), whatever it was doing."""
    check_target(m, to)
    inst = facts.instance
    if expect is not None and inst.state != expect:
        raise GuardMismatch(f"{m.name}/{inst.key} is in {inst.state}, not {expect}")
    entry = _entry(inst, "repoint", by, reason=reason)
    return _transition(m, facts, to, entry, by, step="repoint")


def _operator_entry(
    m: Machine[Any],
    facts: WorkflowFacts,
    action: str,
    allowed: frozenset[str],
    by: Writer,
    reason: str | None,
) -> WorkflowHistoryEntry:
    inst = facts.instance
    if inst.status not in allowed:
        raise GuardMismatch(f"{m.name}/{inst.key} is {inst.status}: cannot {action}")
    return _entry(inst, action, by, reason=reason)


def cancel(
    m: Machine[Any], facts: WorkflowFacts, *, by: Writer, reason: str | None = None
) -> WorkflowTransition:
    """End a live run in CANCELLED (no compensation runs)."""
    entry = _operator_entry(m, facts, "cancel", LIVE, by, reason)
    return _transition(m, facts, "CANCELLED", entry, by)


def pause(
    m: Machine[Any], facts: WorkflowFacts, *, by: Writer, reason: str | None = None
) -> WorkflowTransition:
    """Stop visiting a running instance; a visit in flight is fenced by the version."""
    inst = facts.instance
    entry = _operator_entry(m, facts, "pause", ACTIVE, by, reason)
    return _write(inst, Move(inst.state, "paused", None, compensate_to=inst.compensate_to), entry, by)


def resume(
    m: Machine[Any], facts: WorkflowFacts, *, by: Writer, reason: str | None = None
) -> WorkflowTransition:
    """Visit a paused instance's current state again at once."""
    inst = facts.instance
    entry = _operator_entry(m, facts, "resume", frozenset({"paused"}), by, reason)
    move = Move(inst.state, "running", "resume", 0.0, 0.0, inst.compensate_to)
    return _write(inst, move, entry, by)


def resolve(
    m: Machine[Any], facts: WorkflowFacts, *, outcome: str, by: Writer, reason: str | None = None
) -> WorkflowTransition:
    """A human's choice for an ``uncertain`` instance (see :data:`RESOLUTIONS`)."""
    check_resolution(outcome)
    inst = facts.instance
    if inst.status != "uncertain":
        raise GuardMismatch(f"{m.name}/{inst.key} is {inst.status}, not uncertain")
    entry = _entry(inst, "resolve", by, reason=f"{outcome}: {reason or ''}".strip())
    if inst.held_state == COMPENSATING:
        return _resolve_compensation(m, facts, outcome, entry, by)
    held = m.states.get(inst.held_state or "")
    if held is None:
        raise GuardMismatch(f"{m.name}/{inst.key} holds no state to resume ({inst.held_state!r})")
    if outcome == "retry":
        return _write(inst, Move(held.name, "running", "resolve", 0.0, 0.0), entry, by)
    target = {"succeeded": held.on_success, "failed": held.on_failure, "compensate": FAILED}[outcome]
    return _transition(m, facts, target, entry, by, step="resolve")


def _resolve_compensation(
    m: Machine[Any], facts: WorkflowFacts, outcome: str, entry: WorkflowHistoryEntry, by: Writer
) -> WorkflowTransition:
    """A compensation that could not be told: give up (failed), or go on compensating."""
    inst = facts.instance
    terminal = inst.compensate_to or FAILED
    if outcome == "failed":
        return _write(inst, Move(terminal, m.terminals[terminal], None), entry, by)
    status = "compensated" if outcome == "succeeded" else "done"
    stuck = tuple((e.id, status) for e in facts.effects if e.status == "uncertain")
    move = Move(COMPENSATING, "running", "resolve", 0.0, 0.0, compensate_to=terminal)
    return _write(inst, move, entry, by, Writes(effect_status=stuck))
