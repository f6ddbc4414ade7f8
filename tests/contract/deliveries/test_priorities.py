"""Priorities: lower runs first within a subscription, aged so that none starves, FIFO per key kept."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import msgspec
import pytest

from eventbus import Bus, Context, Envelope, Event, Retry
from eventbus.errors import InvalidPriority
from eventbus.workflows import Machine

from ...conftest import BusFactory, Target
from ...features.schedules._support import rewind, store_rows
from ...support.helpers import counts, drain


class Job(Event, event_type="test.prio_job"):
    name: str


class Trigger(Event, event_type="test.prio_trigger"):
    pass


def _record(bus: Bus, name: str = "jobs", ordered: bool = False) -> list[str]:
    """Subscribe ``name`` to Job; the names handled, in order."""
    handled: list[str] = []

    @bus.subscribe(Job, name=name, ordered=ordered)
    async def record(event: Job, ctx: Context) -> None:
        handled.append(event.name)

    return handled


async def _in_order(bus: Bus) -> None:
    """Drain one delivery per claim, so the handled order is the claim order."""
    await drain(bus, concurrency=1, batch_size=1)


@pytest.mark.append_only
async def test_lower_priority_runs_first_and_ties_keep_publish_order(bus: Bus) -> None:
    handled = _record(bus)
    await bus.register()
    priorities = {"p5": 5, "p0a": 0, "p9": 9, "p0b": 0, "p3": 3, "p1": 1}
    await bus.publish_many(Envelope(Job(name=n), priority=p) for n, p in priorities.items())
    await _in_order(bus)
    assert handled == ["p0a", "p0b", "p1", "p3", "p5", "p9"]


async def test_single_publishes_take_their_priority_and_show_it(bus: Bus) -> None:
    handled = _record(bus)
    await bus.register()
    ids = [(await bus.publish(Job(name=n), priority=p)).event_id for n, p in (("late", 7), ("default", 0))]
    await _in_order(bus)
    assert handled == ["default", "late"]
    late = await bus.event(ids[0])
    assert late.priority == 7 and [d.priority for d in late.deliveries] == [7]
    assert (await bus.delivery(late.deliveries[0].id)).priority == 7


@pytest.mark.append_only
async def test_an_old_low_priority_delivery_runs_before_fresh_high_priority_ones(
    make_bus: BusFactory,
) -> None:
    # Each level is worth 0.05 s of waiting: priority 9 sorts 0.45 s after its time.
    bus = await make_bus(priority_step_seconds=0.05)
    handled = _record(bus)
    await bus.register()
    await bus.publish(Job(name="old"), priority=9)
    await anyio.sleep(0.6)  # the aging itself is what is tested: the old one waited longer than 9 steps
    await bus.publish_many(Envelope(Job(name=f"fresh{i}"), priority=0) for i in range(3))
    await bus.publish(Job(name="young"), priority=9)
    await _in_order(bus)
    assert handled == ["old", "fresh0", "fresh1", "fresh2", "young"]


async def test_a_keyed_delivery_never_overtakes_an_earlier_one_of_its_key(bus: Bus) -> None:
    handled = _record(bus, ordered=True)
    await bus.register()
    await bus.publish_many(
        [
            Envelope(Job(name="a0"), ordering_key="a", priority=9),
            Envelope(Job(name="a1"), ordering_key="a", priority=0),
            Envelope(Job(name="b0"), ordering_key="b", priority=0),
            Envelope(Job(name="a2"), ordering_key="a", priority=5),
        ]
    )
    await _in_order(bus)
    # b0 goes first (priority 0, head of its key); a1 waits for its head a0.
    assert handled == ["b0", "a0", "a1", "a2"]


async def test_emitted_follow_ups_take_their_priority(bus: Bus) -> None:
    handled = _record(bus)

    @bus.subscribe(Trigger, name="fan")
    async def fan(event: Trigger, ctx: Context) -> None:
        for name, priority in (("e9", 9), ("e0", 0), ("e5", 5)):
            ctx.emit(Job(name=name), priority=priority)

    await bus.register()
    await bus.publish(Trigger())
    await _in_order(bus)
    assert handled == ["e0", "e5", "e9"]


@pytest.mark.append_only
async def test_a_retry_keeps_its_priority(bus: Bus) -> None:
    handled: list[str] = []

    @bus.subscribe(Job, name="jobs")
    async def flaky(event: Job, ctx: Context) -> None:
        handled.append(f"{event.name}#{ctx.attempt}")
        if event.name == "low" and ctx.attempt == 1:
            raise Retry(delay=0.3)

    await bus.register()
    await bus.publish(Job(name="low"), priority=9)
    await drain(bus, wait_for_scheduled=False)  # the low one runs (nothing else is there) and fails
    await anyio.sleep(0.4)  # its retry is due: only its priority keeps it behind what comes next
    await bus.publish_many(Envelope(Job(name=f"high{i}"), priority=0) for i in range(2))
    await _in_order(bus)
    assert handled == ["low#1", "high0#1", "high1#1", "low#2"]


async def test_a_new_subscription_backfills_with_each_events_priority(bus: Bus) -> None:
    await bus.publish_many(Envelope(Job(name=f"p{p}"), priority=p) for p in (6, 2, 8, 0))
    handled = _record(bus, name="late-subscriber")
    await bus.register()
    await _in_order(bus)
    assert handled == ["p0", "p2", "p6", "p8"]


class Run(msgspec.Struct):
    name: str


priority_machine = Machine("prio-runs", checkpoint=Run, key=lambda c: c.name)
RUNS: list[str] = []


@priority_machine.state(initial=True, on_success="DONE", on_failure="DONE")
async def VISIT(c: Any, ctx: object) -> None:
    RUNS.append(c.name)


priority_machine.terminal("DONE")


async def test_workflow_starts_take_their_priority(bus: Bus) -> None:
    RUNS.clear()
    bus.include(priority_machine)
    run = Run

    @bus.subscribe(Trigger, name="starter")
    async def starter(event: Trigger, ctx: Context) -> None:
        ctx.start(priority_machine, run(name="ctx4"), priority=4)

    await bus.register()
    for name, priority in (("w9", 9), ("w0", 0), ("w6", 6)):
        await bus.workflows.start(priority_machine, run(name=name), priority=priority)
    await bus.publish(Trigger())
    await _in_order(bus)
    assert [r for r in RUNS if r != "ctx4"] == ["w0", "w6", "w9"]
    assert "ctx4" in RUNS


async def test_a_schedule_publishes_with_its_priority(bus: Bus, target: Target) -> None:
    bus.schedule("prio-tick", Trigger, every=timedelta(hours=1), priority=7)
    bus.subscribe(Trigger, name="ticks")(_noop)
    await bus.register()
    await bus.schedules.declare()
    await rewind(target, "prio-tick", 3600)
    assert (await bus.schedules.tick()).fired == 1
    found = await store_rows(
        target,
        "SELECT e.priority, d.priority_wait FROM events e JOIN deliveries d ON d.event_id = e.id "
        "WHERE e.event_type = 'test.prio_trigger'",
        "SELECT e.priority, d.priority_wait FROM {s}.events e JOIN {s}.deliveries d ON d.event_id = e.id "
        "WHERE e.event_type = 'test.prio_trigger'",
    )
    assert found == [(7, 7 * 60.0)]


async def _noop(event: Trigger, ctx: Context) -> None:
    return None


BAD_PRIORITIES: tuple[Any, ...] = (10, -1, "1", 1.0, True, None)


async def test_the_next_due_time_and_the_lag_go_by_run_at_whatever_the_priority(
    bus: Bus, target: Target
) -> None:
    """A delivery's place in the claim order (its run_at plus its priority's wait) is not
    when it is due: the next due time, the subscription's lag and the status's oldest
    pending age are all read by run_at, whatever the priorities of the rows."""
    _record(bus)
    ids = await bus.register()
    await bus.publish(Job(name="due first, placed last"), priority=9, delay=10)
    await bus.publish(Job(name="due last, placed first"), priority=0, delay=100)
    wait = await bus.backend.deliveries.next_run_in(ids["jobs"])
    assert wait is not None and 0 < wait <= 10
    # Both past due: the priority 9 row by about 100 s, the priority 0 row by about 10 s.
    await store_rows(
        target,
        "UPDATE deliveries SET run_at = run_at - 110",
        "UPDATE {s}.deliveries SET run_at = run_at - interval '110 seconds'",
    )
    wait = await bus.backend.deliveries.next_run_in(ids["jobs"])
    assert wait is not None and -101 < wait <= -99
    (info,) = await bus.list_subscriptions()
    assert info.lag_seconds is not None and 99 <= info.lag_seconds < 110
    oldest = (await bus.backend.inspect.status()).oldest_pending_seconds
    assert oldest is not None and 99 <= oldest < 110


async def test_a_bad_priority_is_refused_before_anything_is_written(bus: Bus) -> None:
    _record(bus)
    bus.include(priority_machine)
    await bus.register()
    for bad in BAD_PRIORITIES:
        with pytest.raises(InvalidPriority):
            await bus.publish(Job(name="x"), priority=bad)
        with pytest.raises(InvalidPriority):
            await bus.publish_many([Envelope(Job(name="ok")), Envelope(Job(name="x"), priority=bad)])
        with pytest.raises(InvalidPriority):
            bus.schedule("bad-priority", Trigger, every=timedelta(hours=1), priority=bad)
        with pytest.raises(InvalidPriority):
            await bus.workflows.start(priority_machine, Run(name="x"), priority=bad)
    assert await counts(bus) == {}


async def test_a_bad_priority_in_a_handler_fails_its_delivery(bus: Bus) -> None:
    errors: list[str] = []

    @bus.subscribe(Trigger, name="emitter", max_attempts=1)
    async def emitter(event: Trigger, ctx: Context) -> None:
        try:
            ctx.emit(Job(name="x"), priority=99)
        except InvalidPriority as exc:
            errors.append(str(exc))
        ctx.start(priority_machine, Run(name="y"), priority=-3)

    bus.include(priority_machine)
    await bus.register()
    await bus.publish(Trigger())
    await drain(bus)
    assert errors == ["priority must be from 0 (first) to 9, got 99"]
    c = await counts(bus)
    assert c[("emitter", "dead")] == 1 and ("prio-runs", "pending") not in c


def test_a_bad_priority_step_is_refused(target: Target) -> None:
    for step in (0, -1.0, float("nan"), 86401.0, "60"):
        with pytest.raises(InvalidPriority):
            target.bus(priority_step_seconds=step)


async def test_rows_from_before_the_migration_get_priority_0_and_a_claim_place(
    make_bus: BusFactory, target: Target
) -> None:
    first = await make_bus()
    _record(first)
    await first.register()
    await first.aclose()
    await _undo_priorities(target)  # the store as migration 0014 left it
    await store_rows(
        target,
        "INSERT INTO events (event_type, payload, deliver_at, created_at) SELECT 'test.prio_job', "
        'CAST(\'{"name": "before"}\' AS BLOB), 0, 0',
        "INSERT INTO {s}.events (event_type, payload) "
        "VALUES ('test.prio_job', convert_to('{\"name\": \"before\"}', 'UTF8'))",
    )
    await store_rows(
        target,
        "INSERT INTO deliveries (event_id, subscription_id, run_at, updated_at) "
        "SELECT id, 1, 0, 0 FROM events",
        "INSERT INTO {s}.deliveries (event_id, subscription_id) SELECT id, 1 FROM {s}.events",
    )
    bus = target.bus()  # a bus of the new version, on the store as the old one left it
    try:
        handled = _record(bus)
        assert await bus.migrate() == ["0015_add_priorities.sql"]
        await bus.publish(Job(name="after"), priority=1)
        await _in_order(bus)
    finally:
        await bus.aclose()
    assert handled == ["before", "after"]
    found = await store_rows(
        target, "SELECT priority FROM events ORDER BY id", "SELECT priority FROM {s}.events ORDER BY id"
    )
    assert found == [(0,), (1,)]


async def _undo_priorities(target: Target) -> None:
    """Drop what migration 0015 added, and its record, so the next migrate applies it to existing rows."""
    statements = [
        ("DROP INDEX deliveries_claim_order", "DROP INDEX {s}.deliveries_claim_order"),
        ("SELECT 1", "DROP FUNCTION {s}.claim_place"),
        # the append-only path's view (migration 0024) reads the column; this bus does not use it
        ("SELECT 1", "DROP VIEW {s}.delivery_rows"),
        (
            "ALTER TABLE deliveries DROP COLUMN priority_wait",
            "ALTER TABLE {s}.deliveries DROP COLUMN priority_wait",
        ),
        ("ALTER TABLE events DROP COLUMN priority", "ALTER TABLE {s}.events DROP COLUMN priority"),
        (
            "DELETE FROM schema_migrations WHERE version = 15",
            "DELETE FROM {s}.schema_migrations WHERE version = 15",
        ),
    ]
    for sqlite, postgres in statements:
        await store_rows(target, sqlite, postgres)
