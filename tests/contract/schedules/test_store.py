"""The ScheduleStore port on both backends: declare, tick, inspect and operate.

The store is driven by a scripted planner (the port's ``SchedulePlanner``),
so each test says what a tick decides and checks that the store records,
publishes and advances exactly that, on the database clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from eventbus import Bus, Context, Event
from eventbus.backends.base import OutgoingEvent, PlannedOccurrence, ScheduleDecl, TickPlan
from eventbus.types import ScheduleInfo

from ...support.helpers import drain

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)

Decide = Callable[[ScheduleInfo, datetime, Sequence[datetime]], TickPlan]


class Beat(Event, event_type="test.beat"):
    pass


def decl(name: str, **changes: object) -> ScheduleDecl:
    base = ScheduleDecl(
        name=name, target_kind="event", target="test.beat", cron=None, every_seconds=60.0, anchor=EPOCH,
        timezone="UTC", missed="latest", max_catchup=100, overlap="allow", cooldown_seconds=0.0,
        jitter_seconds=0.0, dst_gap="shift", dst_fold="first",
    )  # fmt: skip
    return msgspec.structs.replace(base, **changes)


def work(name: str, when: datetime) -> OutgoingEvent:
    return OutgoingEvent(event_type="test.beat", payload=b"{}", key=f"{name}@{when.isoformat()}")


def fire_due(row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
    """Fire what was requested, and the next occurrence when due and not paused; look again in an hour."""
    items = [PlannedOccurrence(t, "fired", work(row.name, t), existing=True) for t in requested]
    at = row.next_occurrence_at
    due = at <= now and not row.paused
    if due:
        items.append(PlannedOccurrence(at, "fired", work(row.name, at)))
    return TickPlan(items, at + MINUTE if due else at, whole(now) + HOUR, None)


def whole(t: datetime) -> datetime:
    return t.replace(microsecond=0)


def timeless(row: ScheduleInfo) -> ScheduleInfo:
    """The row without ``updated_at``, which every declare sets."""
    return msgspec.structs.replace(row, updated_at=None)


class Scripted:
    """A SchedulePlanner that plans as the test says and notes what the store handed it.

    A new schedule's first occurrence is ``lead`` from the time the store gives
    (a minute ago by default: due at once), in whole seconds.
    """

    def __init__(self, *names: str, decide: Decide = fire_due, lead: timedelta = -MINUTE) -> None:
        self._names = sorted(names)
        self.set_id = hashlib.sha256("\n".join(self._names).encode()).hexdigest()[:32]
        self.decide = decide
        self.lead = lead
        self.firsts: list[tuple[str, datetime]] = []
        self.plans: list[tuple[ScheduleInfo, datetime, list[datetime]]] = []

    def names(self) -> Sequence[str]:
        return self._names

    def first_occurrence(self, decl: ScheduleDecl, start: datetime) -> datetime:
        self.firsts.append((decl.name, start))
        return whole(start) + self.lead

    def plan(self, row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        self.plans.append((row, now, list(requested)))
        return self.decide(row, now, requested)

    def planned(self) -> list[str]:
        return [row.name for row, _, _ in self.plans]


async def test_declare_creates_then_updates_in_place_keeping_occurrences(bus: Bus) -> None:
    store = bus.backend.schedules
    planner = Scripted("a", "b")
    await store.declare([decl("b"), decl("a")], planner)
    a, b = await store.find()
    assert (a.name, b.name) == ("a", "b"), "found by name"
    start = dict(planner.firsts)["a"]
    assert a.next_occurrence_at == a.next_run_at == whole(start) - MINUTE, "the planner's first occurrence"
    assert (a.every_seconds, a.missed, a.paused, a.requested, a.last_run_at) == (
        60.0,
        "latest",
        False,
        False,
        None,
    )
    assert await store.find("a") == [a] and await store.find("nope") == []

    await store.tick(planner, 10)
    recorded = await store.occurrences("a", 10)
    assert [o.status for o in recorded] == ["fired"]
    moved = (await store.find("a"))[0]

    await store.declare([decl("a"), decl("b")], planner)
    (same,) = await store.find("a")
    assert len(planner.firsts) == 2 and timeless(same) == timeless(moved), "the same declaration: no change"

    await store.declare([decl("a", every_seconds=120.0, missed="skip")], planner)
    assert planner.firsts[-1] == ("a", moved.next_occurrence_at), "new times start from the old next one"
    (changed,) = await store.find("a")
    assert (changed.every_seconds, changed.missed) == (120.0, "skip")
    assert changed.next_occurrence_at == changed.next_run_at == moved.next_occurrence_at - MINUTE
    await store.declare([decl("a", every_seconds=120.0, missed="all")], planner)
    assert len(planner.firsts) == 3 and (await store.find("a"))[0].missed == "all", (
        "a policy alone: same times"
    )
    assert await store.occurrences("a", 10) == recorded, "recorded occurrences stay"


async def test_a_tick_publishes_records_and_advances_as_planned(bus: Bus) -> None:
    store = bus.backend.schedules

    def fire_and_note_a_miss(row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        at = row.next_occurrence_at
        items = [
            PlannedOccurrence(at - MINUTE, "skipped_missed"),
            PlannedOccurrence(at, "fired", work("a", at)),
        ]
        return TickPlan(items, at + MINUTE, whole(now) + HOUR, None)

    planner = Scripted("a", decide=fire_and_note_a_miss)
    await store.declare([decl("a")], planner)
    (before,) = await store.find("a")
    report = await store.tick(planner, 10)
    assert (report.schedules, report.fired, report.recorded, report.full) == (1, 1, 2, False)
    assert report.next_due_in is not None and 3500 < report.next_due_in <= 3600

    ((row, now, requested),) = planner.plans
    assert row == before and requested == [] and before.next_occurrence_at <= now
    at = before.next_occurrence_at
    fired, missed = await store.occurrences("a", 10)
    assert (fired.scheduled_for, fired.status, missed.scheduled_for, missed.status) == (
        at, "fired", at - MINUTE, "skipped_missed",
    ), "newest first"  # fmt: skip
    assert fired.event_id is not None and fired.fired_at is not None
    assert fired.finished_at == fired.fired_at, "an event nothing subscribes to is done when it fires"
    assert missed.event_id is None and missed.fired_at is None
    event = await bus.event(fired.event_id)
    assert (event.event_type, event.key, event.payload) == ("test.beat", f"a@{at.isoformat()}", b"{}")
    (after,) = await store.find("a")
    assert (after.next_occurrence_at, after.next_run_at) == (at + MINUTE, whole(now) + HOUR)
    assert after.last_event_id == fired.event_id and after.last_run_at is not None
    assert [o.status for o in await store.occurrences("a", 1)] == ["fired"], "limit"

    again = await store.tick(planner, 10)
    assert (again.schedules, again.fired) == (0, 0) and len(planner.plans) == 1, "nothing is due"


async def test_a_tick_claims_only_due_schedules_of_its_set_up_to_the_limit(bus: Bus) -> None:
    store = bus.backend.schedules
    every, only_a = Scripted("a", "b", "c"), Scripted("a")
    later = Scripted("d", lead=HOUR)
    await store.declare([decl("a"), decl("b"), decl("c")], every)
    await store.declare([decl("a")], only_a)
    await store.declare([decl("d")], later)

    assert (await store.tick(only_a, 10)).schedules == 1 and only_a.planned() == ["a"]
    first = await store.tick(every, 1)
    assert (first.schedules, first.full) == (1, True)
    rest = await store.tick(every, 10)
    assert (rest.schedules, rest.full) == (1, False)
    assert sorted(every.planned()) == ["b", "c"], "a was moved on; b and c once each"
    assert (await store.tick(later, 10)).schedules == 0 and later.plans == [], "d is not due"


async def test_paused_schedules_wait_unless_requested(bus: Bus) -> None:
    store = bus.backend.schedules
    planner = Scripted("a")
    await store.declare([decl("a")], planner)
    assert await store.pause("a", True) and (await store.find("a"))[0].paused
    assert (await store.tick(planner, 10)).schedules == 0 and planner.plans == []

    (now,) = await store.request("a", None)  # a trigger: one occurrence at the database's now
    assert (await store.find("a"))[0].requested
    report = await store.tick(planner, 10)
    ((row, _, requested),) = planner.plans
    assert row.paused and requested == [now] and (report.fired, report.recorded) == (1, 1)
    (fired,) = await store.occurrences("a", 10)
    assert (fired.scheduled_for, fired.status) == (now, "fired") and fired.event_id is not None
    assert not (await store.find("a"))[0].requested

    assert await store.pause("a", False) and not (await store.find("a"))[0].paused
    assert not await store.pause("nope", True) and await store.request("nope", None) == []


async def test_requests_fire_each_occurrence_at_most_once(bus: Bus) -> None:
    store = bus.backend.schedules

    def fire_requested_skip_one(row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        items = [PlannedOccurrence(t, "fired", work("a", t), existing=True) for t in requested]
        if not any(t == t3 for t in requested):
            items.append(PlannedOccurrence(t3, "skipped_missed"))
        return TickPlan(items, row.next_occurrence_at, whole(now) + HOUR, None)

    planner = Scripted("a", decide=fire_requested_skip_one, lead=HOUR)
    await store.declare([decl("a")], planner)
    (row,) = await store.find("a")
    t1, t2, t3 = (row.next_occurrence_at - n * HOUR for n in (4, 3, 2))
    assert sorted(await store.request("a", [t2, t1])) == [t1, t2]
    assert [o.status for o in await store.occurrences("a", 10)] == ["requested", "requested"]
    assert (await store.tick(planner, 10)).fired == 2, "a request makes the schedule due now"
    assert sorted(planner.plans[0][2]) == [t1, t2], "the requested times"
    assert [(o.scheduled_for, o.status) for o in await store.occurrences("a", 10)] == [
        (t3, "skipped_missed"), (t2, "fired"), (t1, "fired"),
    ]  # fmt: skip

    assert await store.request("a", [t1, t3]) == [t3], "a fired time is left alone, a skipped one asked again"
    assert (await store.tick(planner, 10)).fired == 1 and planner.plans[1][2] == [t3]
    statuses = {o.scheduled_for: o.status for o in await store.occurrences("a", 10)}
    assert statuses == {t1: "fired", t2: "fired", t3: "fired"}
    events = {(await bus.event(o.event_id)).key for o in await store.occurrences("a", 10) if o.event_id}
    assert events == {f"a@{t.isoformat()}" for t in (t1, t2, t3)}, "one event per occurrence"


async def test_a_failed_plan_records_nothing_and_keeps_requests_waiting(bus: Bus) -> None:
    store = bus.backend.schedules

    def fail(row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        return TickPlan((), row.next_occurrence_at, whole(now) + HOUR, row.buffered_for, failed=True)

    planner = Scripted("a", decide=fail)
    await store.declare([decl("a")], planner)
    (before,) = await store.find("a")
    (when,) = await store.request("a", [before.next_occurrence_at - HOUR])
    report = await store.tick(planner, 10)
    assert (report.schedules, report.fired, report.recorded) == (1, 0, 0)
    (waiting,) = await store.occurrences("a", 10)
    assert (waiting.scheduled_for, waiting.status) == (when, "requested")
    (after,) = await store.find("a")
    assert after.requested and after.next_occurrence_at == before.next_occurrence_at
    assert after.next_run_at == whole(planner.plans[0][1]) + HOUR and after.last_event_id is None


@pytest.mark.append_only  # the firing's delivery completes in the ring's outcome log there
async def test_a_tick_notes_when_the_last_firing_s_work_finished(bus: Bus) -> None:
    @bus.subscribe(Beat, name="beat")
    async def beat(event: Beat, ctx: Context) -> None:
        pass

    await bus.register()
    store = bus.backend.schedules

    def fire_and_look_again_now(row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        at = row.next_occurrence_at
        fired = [PlannedOccurrence(at, "fired", work("a", at))] if at <= now else []
        return TickPlan(fired, at + HOUR, whole(now) - MINUTE, None)

    planner = Scripted("a", decide=fire_and_look_again_now)
    await store.declare([decl("a")], planner)
    await store.tick(planner, 10)
    (fired,) = await store.occurrences("a", 10)
    await store.tick(planner, 10)
    assert planner.plans[1][0].last_finished_at is None, "its delivery is still pending"

    await drain(bus)
    await store.tick(planner, 10)
    noted = planner.plans[2][0]
    assert noted.last_event_id == fired.event_id and noted.last_finished_at is not None
    (finished,) = await store.occurrences("a", 10)
    assert finished.finished_at == noted.last_finished_at and finished.fired_at is not None
    assert finished.fired_at <= finished.finished_at


async def test_remove_deletes_the_schedule_and_its_occurrences(bus: Bus) -> None:
    store = bus.backend.schedules
    planner = Scripted("a", "b")
    await store.declare([decl("a"), decl("b")], planner)
    await store.tick(planner, 10)
    assert len(await store.occurrences("a", 10)) == 1
    assert await store.remove("a") and not await store.remove("a")
    assert await store.find("a") == [] and await store.occurrences("a", 10) == []
    assert [s.name for s in await store.find()] == ["b"] and len(await store.occurrences("b", 10)) == 1
