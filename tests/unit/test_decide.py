"""The decide step with no database: facts and an outcome in, the transition out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from eventbus import GuardMismatch
from eventbus.backends.base import WorkflowEffect, WorkflowFacts, WorkflowTransition
from eventbus.errors import UndeclaredState
from eventbus.types import (
    ApprovalStatus,
    EffectStatus,
    WorkflowApprovalRow,
    WorkflowChildRow,
    WorkflowEffectRow,
    WorkflowInstance,
    WorkflowSignalRow,
)
from eventbus.workflows import Approval, Fail, Goto, Machine, StepContext, Uncertain, Yield
from eventbus.workflows import _decide as d
from eventbus.workflows._wake import wake_cause

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BY = d.Writer("worker:test", 7, "lease-7")


class Order(msgspec.Struct):
    id: str
    amount: int = 10


def machine() -> Machine[Order]:
    m = Machine("orders", checkpoint=Order, key=lambda c: c.id)

    async def noop(c: Order, ctx: StepContext) -> None: ...

    m.state(initial=True, on_success="PAY", on_failure="FAILED", also=("SHIP",), name="START")(noop)
    m.state(on_success="DONE", on_failure="POLL", max_visits=3, name="PAY")(noop)
    m.state(on_success="DONE", on_failure="POLL", continue_run=False, poll=5.0, wake_on="go", name="POLL")(
        noop
    )
    m.state(on_success="DONE", on_failure="FAILED", name="SHIP")(noop)
    approval = Approval(timeout=timedelta(hours=1), on_deny="DENIED", on_timeout="FAILED")
    m.state(on_success="DONE", on_failure="FAILED", approval=approval, name="CHARGE")(noop)

    @m.compensation
    async def refund(c: Order, effect: Any, ctx: StepContext) -> None: ...

    m.terminal("DONE")
    m.terminal("DENIED")
    return m


def instance(state: str = "START", status: str = "running", **changes: Any) -> WorkflowInstance:
    base = WorkflowInstance(
        machine="orders", key="o-1", run_id=1, state=state, status=status, version=4,  # type: ignore[arg-type]
        visits={}, attempts=0, checkpoint=msgspec.json.encode(Order("o-1")), last_error_code=None,
        last_error=None, held_state=None, compensate_to=None, next_run_at=None, state_entered_at=NOW,
        run_started_at=NOW, updated_at=NOW, now=NOW,
    )  # fmt: skip
    return msgspec.structs.replace(base, **changes)


def facts(inst: WorkflowInstance | None = None, **parts: Any) -> WorkflowFacts:
    return WorkflowFacts(inst or instance(), **parts)


def effect(id: int, status: EffectStatus = "done", compensation: str | None = "refund") -> WorkflowEffectRow:
    return WorkflowEffectRow(
        id=id, run_id=1, state="PAY", op_key=f"orders/o-1/1/PAY/1/{id}", kind="card.charged", ref={},
        compensation=compensation, status=status,
    )  # fmt: skip


def approval(id: int, status: ApprovalStatus, m: Machine[Order], **changes: Any) -> WorkflowApprovalRow:
    spec = m.states["CHARGE"].approval
    assert spec is not None
    data = spec.input_of(Order("o-1"))
    row = WorkflowApprovalRow(
        id=id, machine="orders", key="o-1", run_id=1, state="CHARGE", input=data,
        input_hash=spec.hash_of(data), status=status, requested_at=NOW, expires_at=NOW + timedelta(hours=1),
        decided_by="ann" if status in ("approved", "denied") else None, decided_at=None, reason="ok",
        consumed_version=None,
    )  # fmt: skip
    return msgspec.structs.replace(row, **changes)


def ran(m: Machine[Order], f: WorkflowFacts, result: object, **changes: Any) -> WorkflowTransition:
    run = d.plan(m, f, BY)
    assert isinstance(run, d.RunState)
    checkpoint = changes.pop("checkpoint", None)
    return d.decide(m, f, d.Ran(run, result, checkpoint, 1.0, **changes), BY)


def test_a_plain_state_runs_and_success_takes_the_success_edge() -> None:
    m = machine()
    run = d.plan(m, facts(), BY)
    assert isinstance(run, d.RunState)
    assert (run.state.name, run.visit, run.checkpoint, run.approval) == ("START", 1, Order("o-1"), None)
    t = ran(m, facts(), None)
    assert (t.state, t.status, t.step, t.expected_version, t.visits) == (
        "PAY",
        "running",
        "next",
        4,
        {"START": 1},
    )
    assert t.lease == (7, "lease-7")
    assert t.history is not None
    assert (t.history.outcome, t.history.state, t.history.visit, t.history.delivery_id) == (
        "ok",
        "START",
        1,
        7,
    )


@pytest.mark.parametrize(
    ("result", "state", "outcome", "code"),
    [
        (Fail("declined", "card declined"), "FAILED", "fail", "declined"),
        (Goto("SHIP"), "SHIP", "goto", None),
        (Goto("POLL"), "FAILED", "error", "undeclared-goto"),
        (Yield(), "FAILED", "error", "cannot-yield"),
        (Uncertain("no answer"), "UNCERTAIN", "uncertain", "uncertain"),
        (ValueError("boom"), "FAILED", "error", "ValueError"),
        (d.TimedOut(2.5), "FAILED", "timeout", "timeout"),
        (42, "FAILED", "error", "bad-return"),
    ],
)
def test_each_outcome_is_one_edge(result: object, state: str, outcome: str, code: str | None) -> None:
    t = ran(machine(), facts(), result)
    assert t.history is not None
    assert (t.state, t.history.outcome, t.error_code) == (state, outcome, code)


def test_a_timed_out_visit_counts_and_keeps_the_checkpoint_it_read() -> None:
    before = instance(state="PAY", visits={"PAY": 1})
    t = ran(machine(), facts(before), d.TimedOut(2.5))
    assert (t.state, t.visits, t.checkpoint) == ("POLL", {"PAY": 2}, before.checkpoint)
    assert (t.error_code, t.error) == ("timeout", "PAY ran past its timeout of 2.5s")


def test_uncertain_holds_the_state_it_stopped_in() -> None:
    t = ran(machine(), facts(), Uncertain("no answer"))
    assert (t.status, t.held_state, t.step) == ("uncertain", "START", None)


def test_a_yield_waits_a_poll_and_wakes_on_its_signals() -> None:
    m = machine()
    t = ran(m, facts(instance("POLL")), Yield())
    assert (t.state, t.status, t.step, t.step_delay, t.next_run_in, t.wake_on) == (
        "POLL", "waiting", "tick", 5.0, 5.0, ("go",),
    )  # fmt: skip
    assert t.history is not None and t.history.yielded
    t = ran(m, facts(instance("POLL")), Yield(poll=timedelta(seconds=2)))
    assert t.step_delay == 2.0
    t = ran(m, facts(instance("POLL")), Fail("again"))  # the failure edge back into a yield point waits too
    assert (t.state, t.status, t.error_code) == ("POLL", "waiting", "again")
    assert t.history is not None and not t.history.yielded


def test_what_the_visit_read_and_recorded_is_written_with_it() -> None:
    m = machine()
    new = WorkflowEffect("START", "orders/o-1/1/START/1/0", "card.charged", "{}", "refund")
    t = ran(m, facts(), None, consumed=(3, 4), effects=(new,), checkpoint=b'{"id":"o-1","amount":11}')
    assert (t.consume_signals, t.effects, t.checkpoint) == ((3, 4), (new,), b'{"id":"o-1","amount":11}')


def test_a_failure_terminal_compensates_recorded_effects_first() -> None:
    m = machine()
    assert ran(m, facts(), Fail("x")).state == "FAILED"
    t = ran(m, facts(effects=(effect(1),)), Fail("x"))
    assert (t.state, t.status, t.step, t.compensate_to) == ("COMPENSATING", "running", "compensate", "FAILED")
    assert ran(m, facts(effects=(effect(1, "compensated"),)), Fail("x")).state == "FAILED"
    new = WorkflowEffect("START", "k", "card.charged", "{}", "refund")
    assert ran(m, facts(), Fail("x"), effects=(new,)).state == "COMPENSATING"


def test_caps_and_unknown_states_decide_before_anything_runs() -> None:
    m = machine()
    t = d.plan(m, facts(instance("PAY", visits={"PAY": 3})), BY)
    assert isinstance(t, WorkflowTransition)
    assert (t.state, t.status, t.error_code) == ("MAX_RETRIES", "failed", "max-retries")
    t = d.plan(m, facts(instance("GONE")), BY)
    assert isinstance(t, WorkflowTransition)
    assert (t.state, t.error_code) == ("FAILED", "unknown-state")


def test_an_approval_is_requested_then_waited_for() -> None:
    m = machine()
    t = d.plan(m, facts(instance("CHARGE")), BY)
    assert isinstance(t, WorkflowTransition) and t.approval_request is not None
    assert (t.status, t.step, t.step_delay, t.approval_request.timeout_seconds) == (
        "waiting_approval", "approval-timeout", 3600.0, 3600.0,
    )  # fmt: skip
    waiting = facts(instance("CHARGE", "waiting_approval"), approvals=(approval(9, "pending", m),))
    assert d.plan(m, waiting, BY) is None
    resumed = d.plan(m, facts(instance("CHARGE"), approvals=(approval(9, "pending", m),)), BY)
    assert isinstance(resumed, WorkflowTransition) and resumed.history is not None
    assert (resumed.history.outcome, resumed.status) == ("approval-wait", "waiting_approval")


def test_a_decided_approval_runs_the_state_or_takes_its_edge() -> None:
    m = machine()
    f = facts(instance("CHARGE", "waiting_approval"), approvals=(approval(9, "approved", m),))
    run = d.plan(m, f, BY)
    assert isinstance(run, d.RunState) and run.approval is not None and run.approval.id == 9
    assert d.decide(m, f, d.Ran(run, None, None, 1.0), BY).approval_updates == ((9, "approved", "approved"),)
    denied = d.plan(m, facts(instance("CHARGE"), approvals=(approval(9, "denied", m),)), BY)
    assert isinstance(denied, WorkflowTransition) and denied.history is not None
    assert (denied.state, denied.history.actor, denied.approval_updates) == (
        "DENIED", "operator:ann", ((9, "denied", "denied"),),
    )  # fmt: skip
    late = approval(9, "pending", m, expires_at=NOW - timedelta(seconds=1))
    expired = d.plan(m, facts(instance("CHARGE", "waiting_approval"), approvals=(late,)), BY)
    assert isinstance(expired, WorkflowTransition)
    assert (expired.state, expired.error_code) == ("FAILED", "approval-expired")


def test_a_changed_input_supersedes_the_open_request() -> None:
    m = machine()
    other = approval(9, "pending", m, input_hash="0" * 64)
    t = d.plan(m, facts(instance("CHARGE"), approvals=(other,)), BY)
    assert isinstance(t, WorkflowTransition) and t.approval_request is not None
    assert t.approval_updates == ((9, "pending", "superseded"), (9, "approved", "superseded")), (
        "closed even if it was approved meanwhile"
    )


def test_compensation_undoes_the_newest_effect_then_ends_in_the_terminal() -> None:
    m = machine()
    inst = instance("COMPENSATING", compensate_to="FAILED", visits={"COMPENSATING": 1})
    run = d.plan(m, facts(inst, effects=(effect(1), effect(2), effect(3, "compensated"))), BY)
    assert isinstance(run, d.RunCompensation) and (run.effect.id, run.visit) == (2, 2)
    t = d.decide(m, facts(inst), d.Compensated(run, None, 1.0), BY)
    assert (t.state, t.step, t.effect_status, t.visits) == (
        "COMPENSATING", "next", ((2, "compensated"),), {"COMPENSATING": 2},
    )  # fmt: skip
    done = d.plan(m, facts(inst, effects=(effect(1, "compensated"),)), BY)
    assert isinstance(done, WorkflowTransition)
    assert (done.state, done.status) == ("FAILED", "failed")


def test_a_failing_compensation_retries_then_becomes_uncertain() -> None:
    m = machine()
    inst = instance("COMPENSATING", compensate_to="FAILED")
    run = d.RunCompensation(effect(1), 1)
    t = d.decide(m, facts(inst), d.Compensated(run, RuntimeError("psp down"), 1.0), BY)
    assert (t.state, t.step, t.attempts, t.step_delay) == ("COMPENSATING", "retry1", 1, 1.0)
    last = msgspec.structs.replace(inst, attempts=2)
    t = d.decide(m, facts(last), d.Compensated(run, RuntimeError("psp down"), 1.0), BY)
    assert (t.state, t.status, t.effect_status, t.held_state) == (
        "UNCERTAIN", "uncertain", ((1, "uncertain"),), "COMPENSATING",
    )  # fmt: skip


def test_operator_moves_are_guarded_and_audited() -> None:
    m = machine()
    op = d.Writer("operator:ann")
    t = d.repoint(m, facts(instance("PAY")), to="SHIP", reason="manual", by=op)
    assert (t.state, t.step, t.lease, t.history and t.history.actor) == (
        "SHIP",
        "repoint",
        None,
        "operator:ann",
    )
    with pytest.raises(GuardMismatch):
        d.repoint(m, facts(instance("PAY")), to="SHIP", reason="x", by=op, expect="START")
    with pytest.raises(UndeclaredState):
        d.repoint(m, facts(), to="NOWHERE", reason="x", by=op)
    paused = d.pause(m, facts(instance("PAY")), by=op)
    assert (paused.state, paused.status, paused.step) == ("PAY", "paused", None)
    with pytest.raises(GuardMismatch):
        d.resume(m, facts(instance("PAY")), by=op)
    resumed = d.resume(m, facts(instance("PAY", "paused")), by=op)
    assert (resumed.status, resumed.step) == ("running", "resume")
    cancelled = d.cancel(m, facts(instance("PAY", "uncertain")), by=op)
    assert (cancelled.state, cancelled.status) == ("CANCELLED", "cancelled")
    with pytest.raises(GuardMismatch):
        d.cancel(m, facts(instance("DONE", "completed")), by=op)


@pytest.mark.parametrize(
    ("outcome", "state", "step"),
    [("succeeded", "DONE", None), ("failed", "POLL", "resolve"), ("retry", "PAY", "resolve")],
)
def test_a_human_resolves_an_uncertain_state(outcome: str, state: str, step: str | None) -> None:
    inst = instance("UNCERTAIN", "uncertain", held_state="PAY")
    t = d.resolve(machine(), facts(inst), outcome=outcome, by=d.Writer("operator:ann"), reason="checked")
    assert (t.state, t.step) == (state, step)
    assert t.history is not None and t.history.reason == f"{outcome}: checked"


def test_a_human_resolves_an_uncertain_compensation() -> None:
    m, op = machine(), d.Writer("operator:ann")
    inst = instance("UNCERTAIN", "uncertain", held_state="COMPENSATING", compensate_to="FAILED")
    f = facts(inst, effects=(effect(1, "uncertain"), effect(2, "compensated")))
    assert d.resolve(m, f, outcome="succeeded", by=op).effect_status == ((1, "compensated"),)
    assert d.resolve(m, f, outcome="retry", by=op).effect_status == ((1, "done"),)
    gave_up = d.resolve(m, f, outcome="failed", by=op)
    assert (gave_up.state, gave_up.status) == ("FAILED", "failed")
    with pytest.raises(GuardMismatch):
        d.resolve(m, facts(instance("PAY")), outcome="retry", by=op)


def test_what_woke_a_visit_is_named_from_its_step_and_facts() -> None:
    m = machine()
    go = WorkflowSignalRow(id=12, run_id=1, name="go", dedupe=None, payload=b"{}", created_at=NOW,
                           consumed_version=None)  # fmt: skip
    child = WorkflowChildRow(
        machine="kid", key="k-1", run_id=1, started=True, status="failed", state="FAILED", checkpoint=None,
        error_code=None, error=None, ended_at=NOW,
    )  # fmt: skip
    waiting = instance("POLL", "waiting")
    cases = [
        ("start", 1, facts(), "start"),
        ("next", 1, facts(), "next"),
        ("tick", 1, facts(waiting), "timer"),
        ("tick", 1, facts(waiting, signals=(go,)), "signal:go"),  # the signal pulled the tick forward
        ("signal-12", 1, facts(waiting, signals=(go,)), "signal:go"),
        ("wake", 1, facts(waiting, signals=(go,)), "signal:go"),
        ("approval-3", 1, facts(instance("CHARGE"), approvals=(approval(3, "denied", m),)), "denied:ann"),
        ("approval-timeout", 1, facts(instance("CHARGE")), "deadline"),
        (
            "approval-timeout",
            1,
            facts(instance("CHARGE"), approvals=(approval(3, "approved", m),)),
            "approved:ann",
        ),
        ("children", 1, facts(children=(child,)), "children:kid/k-1 failed"),
        ("sweep-1760000000", 1, facts(), "sweep"),
        ("retry2", 1, facts(instance("COMPENSATING")), "retry:compensation attempt 3"),
        ("next", 3, facts(), "retry:delivery attempt 3"),
        ("repoint", 1, facts(), "repoint"),
        ("something-new", 1, facts(), "something-new"),
    ]
    for reason, attempt, f, expected in cases:
        assert wake_cause(m, reason, attempt, f) == expected, reason
