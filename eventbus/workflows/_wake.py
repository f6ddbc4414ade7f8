"""What woke a visit: recorded with its history row, told in words on the timeline.

A visit runs because a step event of its version was delivered, and the
step's reason says why it was published: the run started, the previous
visit moved on at once, a poll timer or an approval's deadline came due, a
signal or a decision arrived, children ended, an operator moved the run, or
the recovery sweep re-published a lost tick. :func:`wake_cause` turns that
reason (with the facts the visit read, to name the signal, the decider or
the child) into the short text stored in ``wf_history.woken_by``;
:func:`describe_wake` tells it back in words. A delivery tried again (its
previous attempt crashed or lost its lease) is a ``retry``.

Stored forms are ``kind`` or ``kind:detail``; kinds are those of
:data:`WAKE_KINDS`, and an unknown reason is stored as it came.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..backends.base import WorkflowFacts
from ._machine import Machine

__all__ = ["WAKE_KINDS", "Wake", "describe_wake", "wake_cause"]

WAKE_KINDS = {
    "start": "run started",
    "next": "previous visit moved on",
    "timer": "poll timer",
    "deadline": "approval deadline",
    "signal": "signal",
    "approved": "approved",
    "denied": "denied",
    "approval": "approval decided",
    "children": "child machine finished",
    "retry": "retry",
    "sweep": "recovery sweep (lost tick)",
    "repoint": "operator repoint",
    "resume": "operator resume",
    "resolve": "operator resolve",
    "compensate": "compensation",
}
"""Each kind of cause, told in words (a detail follows some: who, which signal, which child)."""

_FIXED = {
    "start": "start", "next": "next", "tick": "timer", "approval-timeout": "deadline",
    "repoint": "repoint", "resume": "resume", "resolve": "resolve", "compensate": "compensate",
}  # fmt: skip


class Wake(msgspec.Struct, frozen=True):
    """A stored cause told back: its kind (``unknown`` when none was recorded) and its words."""

    kind: str
    text: str


def wake_cause(m: Machine[Any], reason: str, attempt: int, facts: WorkflowFacts) -> str:
    """The cause stored for a visit run by the step ``reason`` at delivery ``attempt``."""
    if attempt > 1:
        return f"retry:delivery attempt {attempt}"
    if reason in ("tick", "approval-timeout"):
        # A signal, a decision or a child's end pulls the waiting tick forward (the step
        # of one instance keeps FIFO order), and the tick then runs for it.
        early = _early(m, facts)
        if early is not None:
            return early
    if reason in _FIXED:
        return _FIXED[reason]
    kind, _, detail = reason.partition("-")
    if kind == "signal":
        return _signal(facts, lambda s: str(s.id) == detail)
    if reason == "wake":  # a signal that arrived during the previous visit
        state = m.lookup(facts.instance.state)
        names = state.wake_on if state is not None else ()
        return _signal(facts, lambda s: s.name in names)
    if kind == "approval":
        return _approval(facts, detail)
    if reason == "children":
        ended = [c for c in facts.children if c.ended_at is not None]
        return _child(ended) if ended else "children"
    if kind == "sweep":
        return "sweep"
    if kind.startswith("retry") and kind[5:].isdigit():  # a compensation tried again after its backoff
        return f"retry:compensation attempt {int(kind[5:]) + 1}"
    return reason


def _early(m: Machine[Any], facts: WorkflowFacts) -> str | None:
    """What woke a waiting instance before its tick was due: an open signal, a decision, a child's end."""
    inst = facts.instance
    state = m.lookup(inst.state)
    if state is not None and any(s.name in state.wake_on for s in facts.signals):
        return _signal(facts, lambda s: s.name in state.wake_on)
    open_ = [a for a in facts.approvals if a.state == inst.state and a.consumed_version is None]
    decided = [a for a in open_ if a.status in ("approved", "denied")]
    if decided:
        return f"{decided[-1].status}:{decided[-1].decided_by}"
    ended = [c for c in facts.children if c.ended_at is not None and c.ended_at >= inst.state_entered_at]
    if ended:
        return _child(ended)
    return None


def _child(ended: list[Any]) -> str:
    last = sorted(ended, key=lambda c: c.ended_at)[-1]
    return f"children:{last.machine}/{last.key} {last.status}"


def _signal(facts: WorkflowFacts, match: Any) -> str:
    found = next((s for s in facts.signals if match(s)), None)
    return "signal" if found is None else f"signal:{found.name}"


def _approval(facts: WorkflowFacts, approval_id: str) -> str:
    found = next((a for a in facts.approvals if str(a.id) == approval_id), None)
    if found is None or found.status not in ("approved", "denied"):
        return "approval"
    return f"{found.status}:{found.decided_by}"


def describe_wake(woken_by: str | None) -> Wake:
    """A stored cause in words; ``unknown`` for a row that recorded none."""
    if woken_by is None:
        return Wake("unknown", "unknown")
    kind, _, detail = woken_by.partition(":")
    words = WAKE_KINDS.get(kind)
    if words is None:
        return Wake("other", woken_by)
    if kind in ("approved", "denied") and detail:
        return Wake(kind, f"{words} by {detail}")
    return Wake(kind, f"{words}: {detail}" if detail else words)
