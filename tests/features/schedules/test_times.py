"""Occurrence times: cron in a zone's wall clock under each DST policy, intervals, validation.

Computed, not waited for: the DST dates of 2026 in Europe/Berlin (spring: 29
March, 02:00 CET -> 03:00 CEST; autumn: 25 October, 03:00 CEST -> 02:00 CET).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from eventbus import Bus, InvalidSchedule
from eventbus.schedules import occurrence_key, window

from ...apps.schedule_events import Beat, Plain, Report


def _utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def _times(gap: str, fold: str, start: datetime, end: datetime) -> Sequence[tuple[datetime, str]]:
    bus = Bus("sqlite:///unused.db")
    s = bus.schedule("nightly", Report, cron="30 2 * * *", tz="Europe/Berlin", dst_gap=gap, dst_fold=fold)  # type: ignore[arg-type]
    return window(s.decl(), start, end)


SPRING = (_utc(2026, 3, 28), _utc(2026, 3, 31))
AUTUMN = (_utc(2026, 10, 24), _utc(2026, 10, 27))


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        # 02:30 does not exist on 29 March: shifted by the gap's hour to 03:30 CEST (01:30 UTC).
        ("shift", [(_utc(2026, 3, 28, 1, 30), "due"), (_utc(2026, 3, 29, 1, 30), "due"),
                   (_utc(2026, 3, 30, 0, 30), "due")]),
        ("skip", [(_utc(2026, 3, 28, 1, 30), "due"), (_utc(2026, 3, 29, 1, 30), "skipped_dst"),
                  (_utc(2026, 3, 30, 0, 30), "due")]),
    ],
)  # fmt: skip
@pytest.mark.parametrize("fold", ["first", "last", "both"])
def test_spring_gap_daily_0230_berlin(gap: str, fold: str, expected: list[tuple[datetime, str]]) -> None:
    assert _times(gap, fold, *SPRING) == expected


@pytest.mark.parametrize(
    ("fold", "expected"),
    [
        # 02:30 happens twice on 25 October: 00:30 UTC (CEST) and 01:30 UTC (CET).
        ("first", [(_utc(2026, 10, 24, 0, 30), "due"), (_utc(2026, 10, 25, 0, 30), "due"),
                   (_utc(2026, 10, 25, 1, 30), "skipped_dst"), (_utc(2026, 10, 26, 1, 30), "due")]),
        ("last", [(_utc(2026, 10, 24, 0, 30), "due"), (_utc(2026, 10, 25, 0, 30), "skipped_dst"),
                  (_utc(2026, 10, 25, 1, 30), "due"), (_utc(2026, 10, 26, 1, 30), "due")]),
        ("both", [(_utc(2026, 10, 24, 0, 30), "due"), (_utc(2026, 10, 25, 0, 30), "due"),
                  (_utc(2026, 10, 25, 1, 30), "due"), (_utc(2026, 10, 26, 1, 30), "due")]),
    ],
)  # fmt: skip
@pytest.mark.parametrize("gap", ["shift", "skip"])
def test_autumn_fold_daily_0230_berlin(gap: str, fold: str, expected: list[tuple[datetime, str]]) -> None:
    assert _times(gap, fold, *AUTUMN) == expected


def test_sub_hourly_cron_across_the_fold_comes_in_instant_order() -> None:
    bus = Bus("sqlite:///unused.db")
    s = bus.schedule("q", Beat, cron="*/30 * * * *", tz="Europe/Berlin", dst_fold="both")
    times = [t for t, _ in window(s.decl(), _utc(2026, 10, 24, 23, 0), _utc(2026, 10, 25, 2, 0))]
    # Every half hour of real time, the repeated hour included: nothing doubled, nothing out of order.
    assert times == [_utc(2026, 10, 24, 23, 0) + timedelta(minutes=30 * i) for i in range(7)]


def test_a_gap_time_shifted_onto_a_real_one_fires_once() -> None:
    bus = Bus("sqlite:///unused.db")
    s = bus.schedule("x", Beat, cron="30 2,3 * * *", tz="Europe/Berlin")
    times = [t for t, _ in window(s.decl(), _utc(2026, 3, 29), _utc(2026, 3, 29, 23))]
    assert times == [_utc(2026, 3, 29, 1, 30)]  # 02:30 -> 03:30 CEST, which is also 03:30


def test_intervals_count_elapsed_time_from_the_anchor_whatever_the_zone() -> None:
    bus = Bus("sqlite:///unused.db")
    anchor = _utc(2026, 3, 29, 0, 10)
    s = bus.schedule("i", Beat, every=timedelta(minutes=45), anchor=anchor, tz="Europe/Berlin")
    times = [t for t, _ in window(s.decl(), _utc(2026, 3, 29), _utc(2026, 3, 29, 3))]
    assert times == [anchor + timedelta(minutes=45 * i) for i in range(4)]


def test_occurrence_keys_are_the_name_and_the_utc_iso_time() -> None:
    when = datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert occurrence_key("nightly", when) == "nightly@2026-10-25T01:30:00+00:00"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of cron= and every="),
        ({"cron": "* * * * *", "every": timedelta(seconds=1)}, "exactly one"),
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"cron": "0 2 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"every": timedelta(0)}, "must be positive"),
        ({"every": timedelta(seconds=1), "missed": "some"}, "missed must be one of"),
        ({"every": timedelta(seconds=1), "overlap": "queue"}, "overlap must be one of"),
        ({"every": timedelta(seconds=1), "dst_fold": "twice"}, "dst_fold must be one of"),
        ({"every": timedelta(seconds=1), "max_catchup": 0}, "max_catchup"),
        ({"every": timedelta(seconds=1), "cooldown": -1}, "cannot be negative"),
        ({"every": timedelta(seconds=1), "anchor": datetime(2026, 1, 1)}, "timezone-aware"),
    ],
)
def test_bad_declarations_raise_a_typed_error(options: dict, message: str) -> None:
    bus = Bus("sqlite:///unused.db")
    with pytest.raises(InvalidSchedule, match=message):
        bus.schedule("bad", Beat, **options)
    assert bus.declared_schedules == {}


def test_event_classes_and_targets_are_checked() -> None:
    bus = Bus("sqlite:///unused.db")
    bus.schedule("plain", Plain, every=timedelta(hours=1))  # no scheduled_for field: fine
    with pytest.raises(InvalidSchedule, match="already declared"):
        bus.schedule("plain", Plain, every=timedelta(hours=1))
    with pytest.raises(InvalidSchedule, match="needs a default"):
        bus.schedule(
            "orders",
            __import__("tests.support.helpers").support.helpers.OrderPlaced,
            every=timedelta(hours=1),
        )
    with pytest.raises(InvalidSchedule, match="start= takes a state machine"):
        bus.schedule("retrain", start=object(), checkpoint=lambda occ: None, cron="0 3 * * 1")
    with pytest.raises(InvalidSchedule, match="no '@'"):
        bus.schedule("a@b", Plain, every=timedelta(hours=1))
