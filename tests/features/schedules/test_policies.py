"""Missed-run, overlap and cooldown policies, declarations and operations, on both backends.

Missed windows are made by moving a schedule's next occurrence into the past
with SQL (as downtime would leave it), never by waiting; overlap and cooldown
use 200 ms intervals and tick by hand.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from eventbus import Bus, Context, InvalidSchedule, UnknownSchedule
from eventbus.schedules import MAX_BACKFILL, occurrence_key
from eventbus.testing import drain

from ...apps.schedule_events import Beat, Broken, Plain
from ...conftest import BusFactory, Target
from ._support import db_now, event_keys, rewind

FAST = timedelta(milliseconds=200)


async def _hourly(make_bus: BusFactory, target: Target, **policy: object) -> tuple[Bus, datetime]:
    """A bus with an hourly schedule whose occurrences sit half an hour off the database's now."""
    now = await db_now(target)
    anchor = now - timedelta(minutes=30)
    bus = await make_bus()
    bus.schedule("hourly", Beat, every=timedelta(hours=1), anchor=anchor, **policy)  # type: ignore[arg-type]
    await bus.schedules.declare()
    return bus, anchor


def _fates(occurrences: list) -> list[str]:
    return [o.status for o in sorted(occurrences, key=lambda o: o.scheduled_for)]


@pytest.mark.parametrize(
    ("policy", "fired", "skipped"),
    [
        ({"missed": "latest"}, 1, 4),
        ({"missed": "all"}, 5, 0),
        ({"missed": "all", "max_catchup": 3}, 3, 2),
        ({"missed": "skip"}, 0, 5),
    ],
)
async def test_downtime_of_five_periods_then_restart(
    make_bus: BusFactory, target: Target, policy: dict, fired: int, skipped: int
) -> None:
    bus, anchor = await _hourly(make_bus, target, **policy)
    await rewind(target, "hourly", 5 * 3600)  # the worker was down for five periods

    report = await bus.schedules.tick()
    assert (report.fired, report.recorded) == (fired, fired + skipped)

    occurrences = sorted(await bus.schedules.occurrences("hourly"), key=lambda o: o.scheduled_for)
    assert [o.scheduled_for for o in occurrences] == [anchor - timedelta(hours=4 - i) for i in range(5)]
    # The newest fire; what is not fired is a visible skipped_missed row.
    assert _fates(occurrences) == ["skipped_missed"] * skipped + ["fired"] * fired
    keys = [occurrence_key("hourly", o.scheduled_for) for o in occurrences if o.status == "fired"]
    assert await event_keys(target, "test.beat") == keys
    info = await bus.schedules.info("hourly")
    assert info.next_occurrence_at == anchor + timedelta(hours=1)
    assert (await bus.schedules.tick()).recorded == 0  # nothing is due twice


async def test_fired_events_carry_scheduled_for_and_the_occurrence_key(
    make_bus: BusFactory, target: Target
) -> None:
    bus, anchor = await _hourly(make_bus, target, missed="latest")
    seen: list[tuple[Beat, str | None]] = []

    @bus.subscribe(Beat, name="beat")
    async def on_beat(event: Beat, ctx: Context) -> None:
        seen.append((event, ctx.key))

    await bus.register()
    await rewind(target, "hourly", 3600)
    await bus.schedules.tick()
    await drain(bus)
    assert seen == [(Beat(scheduled_for=anchor), f"hourly@{anchor.isoformat()}")]
    assert seen[0][0].scheduled_for is not None and seen[0][0].scheduled_for.tzinfo is not None
    (occurrence,) = await bus.schedules.occurrences("hourly")
    assert occurrence.finished_at is not None and occurrence.fired_at is not None


async def _fast(make_bus: BusFactory, **policy: object) -> Bus:
    bus = await make_bus()

    @bus.subscribe(Beat, name="slow")
    async def slow(event: Beat, ctx: Context) -> None:  # runs only when the test drains
        pass

    bus.schedule("fast", Beat, every=FAST, missed="all", **policy)  # type: ignore[arg-type]
    await bus.register()
    await bus.schedules.declare()
    return bus


async def _tick_after(bus: Bus, seconds: float) -> None:
    await asyncio.sleep(seconds)
    await bus.schedules.tick()


async def test_overlap_skip_records_skipped_occurrences_until_the_work_finished(make_bus: BusFactory) -> None:
    bus = await _fast(make_bus, overlap="skip")
    await _tick_after(bus, 0.25)
    await _tick_after(bus, 0.5)  # the first firing's delivery is still pending: skipped
    fates = _fates(await bus.schedules.occurrences("fast", 100))
    assert fates[0] == "fired" and len(fates) >= 3 and set(fates[1:]) == {"skipped_overlap"}

    await drain(bus, wait_for_scheduled=False)  # the work finishes
    await _tick_after(bus, 0.25)
    after = _fates(await bus.schedules.occurrences("fast", 100))[len(fates) :]
    assert after[0] == "fired" and set(after[1:]) <= {"skipped_overlap"}


async def test_overlap_buffer_one_keeps_at_most_one_waiting(make_bus: BusFactory) -> None:
    bus = await _fast(make_bus, overlap="buffer_one")
    await _tick_after(bus, 0.25)
    for _ in range(2):
        await _tick_after(bus, 0.45)
        counted = Counter(_fates(await bus.schedules.occurrences("fast", 100)))
        assert counted["fired"] == 1 and counted["buffered"] == 1 and counted["skipped_overlap"] >= 1
    waiting = (await bus.schedules.info("fast")).buffered_for
    assert waiting is not None

    await drain(bus, wait_for_scheduled=False)
    await _tick_after(bus, 0.25)  # the buffered occurrence fires, under its own time
    by_time = {o.scheduled_for: o.status for o in await bus.schedules.occurrences("fast", 100)}
    assert by_time[waiting] == "fired"
    # Occurrences due since then wait behind the one that just fired: again at most one.
    assert Counter(by_time.values())["buffered"] <= 1
    assert (await bus.schedules.info("fast")).buffered_for != waiting


async def test_cooldown_holds_the_next_firing_after_the_last_finish(
    make_bus: BusFactory, target: Target
) -> None:
    bus = await _fast(make_bus, overlap="allow", cooldown=timedelta(minutes=5))
    await _tick_after(bus, 0.25)
    first = _fates(await bus.schedules.occurrences("fast", 100))
    assert set(first) == {"fired"}
    await drain(bus, wait_for_scheduled=False)
    await _tick_after(bus, 0.3)  # records the finish; inside the cooldown nothing fires
    info = await bus.schedules.info("fast")
    assert info.last_finished_at is not None
    assert info.next_run_at == info.last_finished_at + timedelta(minutes=5)
    assert _fates(await bus.schedules.occurrences("fast", 100)) == first

    await rewind(target, "fast", 300, "last_finished_at", "next_run_at")  # five minutes pass
    await bus.schedules.tick()
    fates = _fates(await bus.schedules.occurrences("fast", 100))
    # What fell due during the cooldown is missed ("all" fires it), then the schedule runs on.
    assert len(fates) > len(first) and set(fates) == {"fired"}


async def test_jitter_delays_a_firing_but_never_past_the_next_occurrence(
    make_bus: BusFactory, target: Target
) -> None:
    bus = await _fast(make_bus, overlap="allow", jitter=timedelta(hours=1))
    await _tick_after(bus, 0.25)
    ids = await bus.register(["slow"])
    delay = await bus.backend.deliveries.next_run_in(ids["slow"])
    assert delay is not None and delay <= FAST.total_seconds()


async def test_pause_resume_and_trigger(make_bus: BusFactory, target: Target) -> None:
    bus, anchor = await _hourly(make_bus, target, missed="latest")
    await bus.schedules.pause("hourly")
    await rewind(target, "hourly", 2 * 3600)
    assert (await bus.schedules.tick()).schedules == 0  # paused: nothing fires
    assert (await bus.schedules.info("hourly")).paused

    when = await bus.schedules.trigger("hourly")  # fires even while paused, once, with its own key
    report = await bus.schedules.tick()
    assert (report.fired, report.recorded) == (1, 1)
    assert await event_keys(target, "test.beat") == [occurrence_key("hourly", when)]
    assert (await bus.schedules.tick()).fired == 0

    await bus.schedules.resume("hourly")  # what fell due while paused is missed: "latest" fires one
    assert (await bus.schedules.tick()).fired == 1
    statuses = {o.scheduled_for: o.status for o in await bus.schedules.occurrences("hourly")}
    assert statuses == {
        anchor - timedelta(hours=1): "skipped_missed",
        anchor: "fired",
        when: "fired",
    }


async def test_backfill_fires_each_occurrence_of_a_past_window_at_most_once(
    make_bus: BusFactory, target: Target
) -> None:
    bus, anchor = await _hourly(make_bus, target, missed="skip")
    await rewind(target, "hourly", 3 * 3600)
    await bus.schedules.tick()  # "skip": three skipped_missed rows
    assert _fates(await bus.schedules.occurrences("hourly")) == ["skipped_missed"] * 3

    requested = await bus.schedules.backfill("hourly", anchor - timedelta(hours=5, minutes=1), anchor)
    # Skipped ones are requested again, older ones recorded for the first time.
    assert requested == [anchor - timedelta(hours=5 - i) for i in range(6)]
    assert (await bus.schedules.tick()).fired == 6
    assert _fates(await bus.schedules.occurrences("hourly")) == ["fired"] * 6
    assert await bus.schedules.backfill("hourly", anchor - timedelta(hours=6), anchor) == [
        anchor - timedelta(hours=6)
    ]
    await bus.schedules.tick()
    keys = await event_keys(target, "test.beat")
    assert len(keys) == len(set(keys)) == 7


async def test_backfill_stops_at_the_next_occurrence_however_far_the_window_reaches(
    make_bus: BusFactory, target: Target
) -> None:
    now = await db_now(target)
    anchor = now - timedelta(days=1)
    bus = await make_bus()
    bus.schedule("decade", Beat, every=timedelta(days=3650), anchor=anchor)
    await bus.schedules.declare()
    # A window to the end of time: only the past is walked, never the future up to year 9999.
    forever = datetime.max.replace(tzinfo=UTC)
    assert await bus.schedules.backfill("decade", anchor - timedelta(days=1), forever) == [anchor]


async def test_backfill_past_the_cap_is_refused_and_requests_nothing(
    make_bus: BusFactory, target: Target
) -> None:
    now = await db_now(target)
    bus = await make_bus()
    bus.schedule("second", Beat, every=timedelta(seconds=1))
    await bus.schedules.declare()
    start = now - timedelta(seconds=MAX_BACKFILL + 100)
    with pytest.raises(InvalidSchedule, match=f"more than {MAX_BACKFILL} occurrences"):
        await bus.schedules.backfill("second", start, now + timedelta(days=30))
    assert await bus.schedules.occurrences("second") == []
    # A window under the cap is requested whole.
    assert len(await bus.schedules.backfill("second", now - timedelta(seconds=99.5), now)) >= 99


async def test_remove_and_unknown_names(make_bus: BusFactory, target: Target) -> None:
    bus, _anchor = await _hourly(make_bus, target)
    await rewind(target, "hourly", 3600)
    await bus.schedules.tick()
    await bus.schedules.remove("hourly")
    assert await bus.schedules.list() == []
    for call in (bus.schedules.remove, bus.schedules.pause, bus.schedules.trigger, bus.schedules.occurrences):
        with pytest.raises(UnknownSchedule):
            await call("hourly")


async def test_changing_the_declaration_updates_it_and_keeps_recorded_occurrences(
    make_bus: BusFactory, target: Target
) -> None:
    bus, anchor = await _hourly(make_bus, target, missed="latest")
    await rewind(target, "hourly", 3600)
    await bus.schedules.tick()

    policy_only = await make_bus()
    policy_only.schedule(
        "hourly", Beat, every=timedelta(hours=1), anchor=anchor, missed="all", overlap="allow"
    )
    await policy_only.schedules.declare()
    info = await policy_only.schedules.info("hourly")
    assert (info.missed, info.overlap, info.next_occurrence_at) == (
        "all",
        "allow",
        anchor + timedelta(hours=1),
    )

    respec = await make_bus()
    respec.schedule("hourly", Plain, cron="15 * * * *")
    await respec.schedules.declare()
    info = await respec.schedules.info("hourly")
    assert (info.cron, info.every_seconds, info.target) == ("15 * * * *", None, "test.plain")
    # The times restart at the new spec's first occurrence after the old next one.
    assert info.next_occurrence_at.minute == 15
    assert anchor + timedelta(hours=1) <= info.next_occurrence_at < anchor + timedelta(hours=2)
    assert len(await respec.schedules.occurrences("hourly")) == 1

    # A bus that no longer declares it leaves it alone: the row stays, nothing fires.
    bare = await make_bus()
    await rewind(target, "hourly", 7200)
    await bare.schedules.declare()
    assert (await bare.schedules.tick()).schedules == 0
    assert [s.name for s in await bare.schedules.list()] == ["hourly"]


async def test_cron_and_interval_targets_fire_on_their_times(make_bus: BusFactory, target: Target) -> None:
    bus = await make_bus()
    bus.schedule("cron", Beat, cron="* * * * * *", tz="Europe/Berlin", missed="all", overlap="allow")
    bus.schedule("plain", Plain, every=timedelta(milliseconds=500), missed="all", overlap="allow")
    started = await db_now(target)
    await bus.schedules.declare()
    for _ in range(3):
        await _tick_after(bus, 0.55)
    cron = sorted(o.scheduled_for for o in await bus.schedules.occurrences("cron"))
    plain = sorted(o.scheduled_for for o in await bus.schedules.occurrences("plain"))
    assert cron and all(t.microsecond == 0 and t >= started for t in cron)
    assert cron == [cron[0] + timedelta(seconds=i) for i in range(len(cron))]
    assert len(plain) >= 2 and plain == [
        plain[0] + timedelta(milliseconds=500 * i) for i in range(len(plain))
    ]
    assert await event_keys(target, "test.beat") == [occurrence_key("cron", t) for t in cron]
    assert await event_keys(target, "test.plain") == [occurrence_key("plain", t) for t in plain]


def test_schedule_info_encodes_to_json() -> None:
    info = msgspec.json.decode(
        msgspec.json.encode({"at": datetime(2026, 1, 1, tzinfo=UTC)}), type=dict[str, datetime]
    )
    assert info["at"].tzinfo is not None


async def test_a_schedule_that_cannot_fire_waits_and_spares_the_others(
    make_bus: BusFactory, target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    bus, anchor = await _hourly(make_bus, target, missed="latest")
    bus.schedule("broken", Broken, every=timedelta(hours=1), anchor=anchor)
    await bus.schedules.declare()
    await rewind(target, "hourly", 3600)
    await rewind(target, "broken", 3600)
    now = await db_now(target)

    report = await bus.schedules.tick()  # one batch with both
    assert (report.schedules, report.fired) == (2, 1)
    assert "'broken' could not be planned" in caplog.text
    assert await bus.schedules.occurrences("broken") == []
    broken = await bus.schedules.info("broken")
    assert broken.next_occurrence_at == anchor and broken.next_run_at >= now + timedelta(seconds=59)
    assert [o.status for o in await bus.schedules.occurrences("hourly")] == ["fired"]
