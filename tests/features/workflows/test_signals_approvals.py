"""Signals (durable, deduplicated, waking a wait) and approvals (bound to the exact input)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest

from eventbus import Bus, GuardMismatch, UnknownApproval, UnknownInstance
from eventbus.errors import RunEnded
from eventbus.workflows import MAX_RETRIES, Approval, Fail, Machine, StepContext, Yield

from ._support import expire_approval, finish, run_until, status_is


class Wait(msgspec.Struct):
    key: str
    got: list[object] = []


sig = Machine("sig", checkpoint=Wait, key=lambda c: c.key)


@sig.state(
    initial=True,
    on_success="DONE",
    on_failure="DONE",
    continue_run=False,
    poll=60.0,
    wake_on="go",
    max_visits=5,
)
async def WAIT(c: Wait, ctx: StepContext) -> Yield | None:
    payload = ctx.signal("go")
    if payload is None:
        return Yield()
    c.got.append(payload)
    return None


sig.terminal("DONE")


class Charge(msgspec.Struct):
    key: str
    amount: int = 100
    approved_by: list[str] = []


def pay_machine(name: str, timeout: float) -> Machine[Charge]:
    m = Machine(name, checkpoint=Charge, key=lambda c: c.key)
    gate = Approval(timeout=timedelta(seconds=timeout), on_deny="DENIED", on_timeout="EXPIRED",
                    input=lambda c: (c.key, c.amount))  # fmt: skip

    @m.state(initial=True, on_success="DONE", on_failure="ADJUST", approval=gate, max_visits=3)
    async def CHARGE(c: Charge, ctx: StepContext) -> Fail | None:
        assert ctx.approval is not None
        c.approved_by.append(ctx.approval.decided_by or "")
        if c.key.startswith("change") and c.amount == 100:
            return Fail("amount-changed")  # the customer changed the order: charge again, for more
        return None

    @m.state(on_success="CHARGE", on_failure="DONE")
    async def ADJUST(c: Charge, ctx: StepContext) -> None:
        c.amount += 100

    m.terminal("DONE")
    m.terminal("DENIED", failed=True)
    m.terminal("EXPIRED", failed=True)
    return m


pay = pay_machine("pay", 60.0)
hurry = pay_machine("hurry", 0.3)


@pytest.fixture
async def wbus(bus: Bus) -> Bus:
    bus.include(sig)
    bus.include(pay)
    bus.include(hurry)
    return bus


async def test_a_signal_sent_before_the_wait_is_kept(wbus: Bus) -> None:
    await wbus.workflows.start(sig, Wait(key="early"))  # no worker yet: the wait has not begun
    assert await wbus.workflows.signal(sig, "early", "go", {"n": 1}, id="s-1")
    assert not await wbus.workflows.signal(sig, "early", "go", {"n": 2}, id="s-1"), "same id: deduplicated"
    await finish(wbus, sig, ["early"], timeout=10)
    inst = await wbus.workflows.instance(sig, "early")
    assert inst.checkpoint.got == [{"n": 1}] and inst.visits == {"WAIT": 1}
    rows = await wbus.workflows.signals(sig, "early")
    assert len(rows) == 1 and rows[0].consumed_version == inst.version


async def test_signals_belong_to_one_run(wbus: Bus) -> None:
    await wbus.workflows.start(sig, Wait(key="runs"))
    assert await wbus.workflows.signal(sig, "runs", "go", "job-1 done", id="job-1")
    await finish(wbus, sig, ["runs"], timeout=10)
    with pytest.raises(RunEnded):  # a late or repeated callback of the finished run 1
        await wbus.workflows.signal(sig, "runs", "go", "job-1 done again", id="job-1")
    with pytest.raises(RunEnded):
        await wbus.workflows.signal(sig, "runs", "go", "job-1 late")
    second = await wbus.workflows.start(sig, Wait(key="runs"))
    assert second.run_id == 2
    with pytest.raises(RunEnded):
        await wbus.workflows.signal(sig, "runs", "go", "for run 1", run_id=1)
    with pytest.raises(UnknownInstance):
        await wbus.workflows.signal(sig, "runs", "go", "for run 3", run_id=3)
    await run_until(wbus, lambda: status_is(wbus, sig, "runs", "waiting"))
    assert (await wbus.workflows.instance(sig, "runs")).checkpoint.got == [], "run 2 read nothing of run 1"
    assert await wbus.workflows.signal(sig, "runs", "go", "job-2 done", id="job-1", run_id=2), (
        "a dedupe id is unique per run"
    )
    await finish(wbus, sig, ["runs"], timeout=10)
    inst = await wbus.workflows.instance(sig, "runs")
    assert (inst.run_id, inst.checkpoint.got) == (2, ["job-2 done"])
    rows = await wbus.workflows.signals(sig, "runs")
    assert [(r.run_id, r.payload, r.consumed_version is not None) for r in rows] == [
        (1, b'"job-1 done"', True),
        (2, b'"job-2 done"', True),
    ]


async def test_a_signal_to_a_key_with_no_instance_is_refused(wbus: Bus) -> None:
    with pytest.raises(UnknownInstance, match="no instance 'nobody'"):
        await wbus.workflows.signal(sig, "nobody", "go", 1)
    assert await wbus.workflows.signals(sig, "nobody") == []


async def test_a_signal_wakes_a_waiting_state_long_before_its_poll(wbus: Bus) -> None:
    await wbus.workflows.start(sig, Wait(key="late"))
    await run_until(wbus, lambda: status_is(wbus, sig, "late", "waiting"))
    waiting = await wbus.workflows.instance(sig, "late")
    assert waiting.next_run_at is not None
    assert await wbus.workflows.signal(sig, "late", "go", "now")
    await finish(wbus, sig, ["late"], timeout=10)  # the poll is a minute away
    inst = await wbus.workflows.instance(sig, "late")
    assert inst.checkpoint.got == ["now"] and inst.visits == {"WAIT": 2}
    assert [r.outcome for r in await wbus.workflows.history(sig, "late")] == ["yield", "ok"]


async def _requested(bus: Bus, m: Machine[Any], key: str) -> int:
    await run_until(bus, lambda: status_is(bus, m, key, "waiting_approval"))
    (row,) = [a for a in await bus.workflows.approvals(m, key) if a.status == "pending"]
    return row.id


async def test_approve_runs_the_state_once_and_records_who(wbus: Bus) -> None:
    await wbus.workflows.start(pay, Charge(key="ok"))
    approval_id = await _requested(wbus, pay, "ok")
    decided = await wbus.workflows.approve(approval_id, by="alice", reason="looks right")
    assert (decided.status, decided.decided_by, decided.reason) == ("approved", "alice", "looks right")
    with pytest.raises(GuardMismatch):
        await wbus.workflows.approve(approval_id, by="mallory")
    await finish(wbus, pay, ["ok"])
    inst = await wbus.workflows.instance(pay, "ok")
    assert (inst.state, inst.checkpoint.approved_by) == ("DONE", ["alice"])
    outcomes = [(r.state, r.outcome) for r in await wbus.workflows.history(pay, "ok")]
    assert outcomes == [("CHARGE", "approval-requested"), ("CHARGE", "ok")]
    (row,) = await wbus.workflows.approvals(pay, "ok")
    assert row.consumed_version == inst.version
    with pytest.raises(UnknownApproval):
        await wbus.workflows.approve(10**9, by="alice")


async def test_deny_takes_the_deny_edge(wbus: Bus) -> None:
    await wbus.workflows.start(pay, Charge(key="no"))
    approval_id = await _requested(wbus, pay, "no")
    await wbus.workflows.deny(approval_id, by="bob", reason="too much")
    await finish(wbus, pay, ["no"])
    inst = await wbus.workflows.instance(pay, "no")
    assert (inst.state, inst.status, inst.checkpoint.approved_by) == ("DENIED", "failed", [])
    last = (await wbus.workflows.history(pay, "no"))[-1]
    assert (last.outcome, last.actor, last.reason, last.next_state) == (
        "denied",
        "operator:bob",
        "too much",
        "DENIED",
    )


async def test_an_approval_expires_into_its_timeout_edge(wbus: Bus) -> None:
    await wbus.workflows.start(hurry, Charge(key="slow"))
    approval_id = await _requested(wbus, hurry, "slow")
    await finish(wbus, hurry, ["slow"])
    assert (await wbus.workflows.instance(hurry, "slow")).state == "EXPIRED"
    with pytest.raises(GuardMismatch):
        await wbus.workflows.approve(approval_id, by="alice")
    (row,) = await wbus.workflows.approvals(hurry, "slow")
    assert row.status == "expired"


async def test_a_changed_input_needs_a_new_approval(wbus: Bus) -> None:
    await wbus.workflows.start(pay, Charge(key="change"))
    first = await _requested(wbus, pay, "change")
    await wbus.workflows.approve(first, by="alice")
    await run_until(wbus, lambda: _pending_again(wbus))
    inst = await wbus.workflows.instance(pay, "change")
    assert (inst.state, inst.status, inst.checkpoint.amount) == ("CHARGE", "waiting_approval", 200)
    old, new = await wbus.workflows.approvals(pay, "change")
    assert (old.id, old.status) == (first, "approved") and old.consumed_version is not None
    assert new.status == "pending" and new.input_hash != old.input_hash
    assert msgspec.json.decode(new.input) == ["change", 200]
    await wbus.workflows.approve(new.id, by="carol")
    await finish(wbus, pay, ["change"])
    assert (await wbus.workflows.instance(pay, "change")).checkpoint.approved_by == ["alice", "carol"]


async def _pending_again(bus: Bus) -> bool:
    return len([a for a in await bus.workflows.approvals(pay, "change") if a.status == "pending"]) == 1


async def test_a_paused_request_waits_again_after_resume_and_still_expires(wbus: Bus) -> None:
    await wbus.workflows.start(hurry, Charge(key="paused"))
    await _requested(wbus, hurry, "paused")
    await wbus.workflows.pause(hurry, "paused")
    await wbus.workflows.resume(hurry, "paused")
    await finish(wbus, hurry, ["paused"])
    assert (await wbus.workflows.instance(hurry, "paused")).state == "EXPIRED"
    outcomes = [r.outcome for r in await wbus.workflows.history(hurry, "paused")]
    assert outcomes[:3] == ["approval-requested", "pause", "resume"] and outcomes[-1] == "expired"
    assert len(await wbus.workflows.approvals(hurry, "paused")) == 1, (
        "the open request is kept, not asked again"
    )


hooked = Machine("hooked", checkpoint=Wait, key=lambda c: c.key)
"""A state that waits for its signal with no poll: only the signal wakes it."""
senders: dict[str, Bus] = {}


@hooked.state(
    initial=True, on_success="DONE", on_failure="DONE", continue_run=False, wake_on="go", max_visits=3
)
async def HOOK(c: Wait, ctx: StepContext) -> Yield | None:
    payload = ctx.signal("go")
    if payload is not None:
        c.got.append(payload)
        return None
    if ctx.visit == 1:  # the callback lands while this visit still runs
        assert await senders[c.key].workflows.signal(hooked, c.key, "go", "mid-visit")
    return Yield()


hooked.terminal("DONE")


async def test_a_signal_sent_during_the_visit_of_a_wait_with_no_poll_wakes_it(bus: Bus) -> None:
    bus.include(hooked)
    senders["mid"] = bus
    await bus.workflows.start(hooked, Wait(key="mid"))
    await finish(bus, hooked, ["mid"], timeout=10)
    inst = await bus.workflows.instance(hooked, "mid")
    assert (inst.state, inst.checkpoint.got, inst.visits) == ("DONE", ["mid-visit"], {"HOOK": 2})
    assert [r.outcome for r in await bus.workflows.history(hooked, "mid")] == ["yield", "ok"]


async def test_an_approval_that_expired_before_its_visit_ran_is_not_honoured(wbus: Bus) -> None:
    await wbus.workflows.start(pay, Charge(key="stale"))
    approval_id = await _requested(wbus, pay, "stale")
    await wbus.workflows.approve(approval_id, by="alice")
    await expire_approval(wbus, approval_id)  # no worker ran the visit before the expiry
    await finish(wbus, pay, ["stale"])
    inst = await wbus.workflows.instance(pay, "stale")
    assert (inst.state, inst.checkpoint.approved_by) == ("EXPIRED", [])
    last = (await wbus.workflows.history(pay, "stale"))[-1]
    assert (last.outcome, last.next_state, last.error_code) == ("expired", "EXPIRED", "approval-expired")
    assert last.error == f"approval {approval_id} expired before its visit ran (approved by alice)"
    (row,) = await wbus.workflows.approvals(pay, "stale")
    assert row.status == "expired" and row.consumed_version == inst.version


class Gate(msgspec.Struct):
    key: str
    ran_with: list[int] = []


gate = Machine("gate", checkpoint=Gate, key=lambda c: c.key)


@gate.state(
    initial=True, on_success="DONE", on_failure="ASIDE", max_visits=3,
    approval=Approval(timeout=60.0, on_deny="DONE", on_timeout="DONE", input=lambda c: c.key),
)  # fmt: skip
async def GATE(c: Gate, ctx: StepContext) -> None:
    assert ctx.approval is not None
    c.ran_with.append(ctx.approval.id)


@gate.state(on_success="GATE", on_failure="DONE")
async def ASIDE(c: Gate, ctx: StepContext) -> None:
    return None


gate.terminal("DONE")


async def test_a_decision_is_used_only_by_the_visit_that_asked_for_it(bus: Bus) -> None:
    bus.include(gate)
    for key in ("parked", "paused"):
        await bus.workflows.start(gate, Gate(key=key))
    first = {key: await _requested(bus, gate, key) for key in ("parked", "paused")}
    # Moved elsewhere while the request is open: the request is closed, and a decision refused.
    await bus.workflows.repoint(gate, "parked", to="ASIDE", reason="park it")
    with pytest.raises(GuardMismatch, match="superseded"):
        await bus.workflows.approve(first["parked"], by="alice")
    # Decided while paused, then moved elsewhere before its visit ran: the decision is not used.
    await bus.workflows.pause(gate, "paused")
    await bus.workflows.approve(first["paused"], by="alice")
    await bus.workflows.repoint(gate, "paused", to="ASIDE", reason="park it")
    again = {key: await _requested(bus, gate, key) for key in ("parked", "paused")}
    for key in ("parked", "paused"):
        assert again[key] != first[key]
        old, new = await bus.workflows.approvals(gate, key)
        assert (old.status, new.status) == ("superseded", "pending")
        assert (await bus.workflows.instance(gate, key)).checkpoint.ran_with == [], "GATE did not run"
        await bus.workflows.approve(again[key], by="bob")
    await finish(bus, gate, ["parked", "paused"])
    for key in ("parked", "paused"):
        assert (await bus.workflows.instance(gate, key)).checkpoint.ran_with == [again[key]]


ask = Machine("ask", checkpoint=Charge, key=lambda c: c.key)


@ask.state(
    initial=True, on_success="DONE", on_failure="DONE", max_visits=2,
    approval=Approval(timeout=0.2, on_deny="DONE", on_timeout="ASK"),
)  # fmt: skip
async def ASK(c: Charge, ctx: StepContext) -> None:
    return None


ask.terminal("DONE")


async def test_approval_rounds_count_as_visits(bus: Bus) -> None:
    bus.include(ask)  # the timeout edge asks again: max_visits bounds the rounds
    await bus.workflows.start(ask, Charge(key="again"))
    await finish(bus, ask, ["again"])
    inst = await bus.workflows.instance(ask, "again")
    assert (inst.state, inst.visits) == (MAX_RETRIES, {"ASK": 2})
    rows = await bus.workflows.history(ask, "again")
    assert [(r.outcome, r.visit) for r in rows] == [
        ("approval-requested", 1), ("expired", 1), ("approval-requested", 2), ("expired", 2), ("cap", 2),
    ]  # fmt: skip
    assert [a.status for a in await bus.workflows.approvals(ask, "again")] == ["expired", "expired"]
