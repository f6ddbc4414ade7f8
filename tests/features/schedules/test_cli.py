"""``eventbus schedule``: the same operations as the Bus, from the database alone."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from ...apps.schedule_events import Beat
from ...conftest import BusFactory, Target
from ...integration.test_cli import eventbus
from ._support import db_now, event_keys, rewind


async def test_list_show_pause_resume_trigger_backfill_remove(make_bus: BusFactory, target: Target) -> None:
    anchor = await db_now(target) - timedelta(minutes=30)
    bus = await make_bus()
    bus.schedule("hourly", Beat, every=timedelta(hours=1), anchor=anchor, missed="skip", overlap="skip")
    await bus.schedules.declare()
    await rewind(target, "hourly", 2 * 3600)
    await bus.schedules.tick()  # two skipped_missed occurrences

    listed = eventbus(target, "schedule", "list").stdout
    assert "hourly" in listed and "every 3600s" in listed and "missed=skip overlap=skip" in listed
    (row,) = json.loads(eventbus(target, "schedule", "list", "--json").stdout)
    assert row["name"] == "hourly" and row["paused"] is False
    shown = eventbus(target, "schedule", "show", "hourly").stdout
    assert shown.count("skipped_missed") == 2 and "next_occurrence_at" in shown

    assert eventbus(target, "schedule", "pause", "hourly").stdout.strip() == "paused hourly"
    assert (await bus.schedules.info("hourly")).paused
    eventbus(target, "schedule", "resume", "hourly")
    assert not (await bus.schedules.info("hourly")).paused

    out = eventbus(target, "schedule", "trigger", "hourly").stdout
    assert out.startswith("requested hourly@")
    start = (anchor - timedelta(hours=2)).isoformat()
    out = eventbus(
        target, "schedule", "backfill", "hourly", "--from", start, "--to", anchor.isoformat()
    ).stdout
    # The two skipped ones and the one before them, never recorded.
    assert out.strip() == "requested 3 occurrence(s) of hourly"
    report = await bus.schedules.tick()  # the worker's tick fires what was requested
    assert report.fired == 4 and len(await event_keys(target, "test.beat")) == 4

    eventbus(target, "schedule", "remove", "hourly", "--yes")
    assert json.loads(eventbus(target, "schedule", "list", "--json").stdout) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("schedule", "show", "nope"), "UnknownSchedule: no schedule named 'nope'"),
        (("schedule", "pause", "nope"), "UnknownSchedule"),
        (("schedule", "trigger", "nope"), "UnknownSchedule"),
        (("schedule", "remove", "nope", "--yes"), "UnknownSchedule"),
        (("schedule", "backfill", "nope", "--from", "yesterday", "--to", "2026-01-01"), "ISO-8601"),
        (("schedule", "backfill", "nope", "--from", "2026-01-02", "--to", "2026-01-01"), "InvalidSchedule"),
    ],
)
async def test_user_mistakes_print_one_line(
    make_bus: BusFactory, target: Target, args: tuple, message: str
) -> None:
    await make_bus()  # migrated
    result = eventbus(target, *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
