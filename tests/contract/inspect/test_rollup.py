"""The throughput rollup: rows appended and summed per step, queue samples once a minute, retention.

Every backend. The rows are written through the port as a worker's flush
writes them (``backend.rollup.record``), and read back through
``Bus.throughput``, which reads ``Inspector.rollup``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from eventbus import ConfigurationError, Context
from eventbus.backends.ports import RollupRow
from eventbus.retention import Retention
from eventbus.throughput import ThroughputPoint, bucket_of, bucket_seconds

from ...support.helpers import OrderPlaced


async def _two_subscriptions(bus) -> None:
    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    @bus.subscribe(OrderPlaced, name="ship")
    async def ship(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.register()


def _minute(minutes_ago: int) -> int:
    return int(time.time()) // 60 * 60 - 60 * minutes_ago


def _at(points: list[ThroughputPoint], minute: int) -> ThroughputPoint:
    """The point of the step starting at ``minute`` (epoch seconds)."""
    (point,) = [p for p in points if p.start == datetime.fromtimestamp(minute, UTC)]
    return point


async def test_rows_of_several_workers_sum_per_minute_with_merged_percentiles(bus) -> None:
    await _two_subscriptions(bus)
    fast, slow = bucket_of(0.002), bucket_of(0.5)
    m = _minute(3)
    stored = await bus.backend.rollup.record(
        [
            RollupRow("charge", m, completed=90, failed=5, dead=1, durations={fast: 96}),
            RollupRow("charge", m, completed=4, durations={slow: 4}),  # a second worker's row
            RollupRow("ship", m, completed=7, durations={fast: 7}),
            RollupRow("charge", _minute(10), completed=3, durations={fast: 3}),
            RollupRow("nosuch", m, completed=1, durations={fast: 1}),  # dropped: no such subscription
        ]
    )
    assert stored == 4
    hour = await bus.throughput(window="1h")
    assert (hour.window, hour.step_seconds, len(hour.points)) == ("1h", 60, 60)
    assert hour.points[-1].start >= datetime.fromtimestamp(_minute(0) - 60, UTC)  # the current minute's
    three = _at(hour.points, m)
    assert (three.completed, three.failed, three.dead) == (101, 5, 1)
    # 103 fast runs and 4 slow ones: the median is fast, the 99th percentile slow.
    assert three.p50_seconds == bucket_seconds(fast) and three.p99_seconds == bucket_seconds(slow)
    assert 0.0018 < three.p50_seconds < 0.0022 and 0.45 < three.p99_seconds < 0.55
    assert sum(p.completed for p in hour.points) == 104
    assert set(hour.subscriptions) == {"charge", "ship"}
    handlers = {h.subscription: h for h in hour.handlers}
    assert (handlers["charge"].completed, handlers["charge"].failed, handlers["charge"].dead) == (97, 5, 1)
    assert handlers["charge"].runs == 103 and handlers["ship"].p95_seconds == bucket_seconds(fast)
    one = await bus.throughput("ship", window="1h")
    assert one.subscription == "ship" and set(one.subscriptions) == {"ship"}
    assert sum(p.completed for p in one.points) == 7
    day = await bus.throughput(window="1d")
    assert (day.step_seconds, len(day.points)) == (600, 144)
    assert sum(p.completed for p in day.points) == 104 and sum(p.failed for p in day.points) == 5


async def test_a_window_outside_the_list_is_a_typed_error(bus) -> None:
    with pytest.raises(ConfigurationError, match="window must be one of 1h, 1d, got '2h'"):
        await bus.throughput(window="2h")


@pytest.mark.pooler  # the probe and the sample are two statements, on whatever server connection
async def test_the_queue_is_sampled_once_per_minute_with_its_depth_and_lag(bus) -> None:
    await _two_subscriptions(bus)
    for i in range(3):
        await bus.publish(OrderPlaced(order_id=f"now-{i}"))
    await bus.publish(OrderPlaced(order_id="later"), delay=3600)  # pending, but not due: no lag
    await bus.pause_subscription("ship")  # paused: still sampled
    minute = _minute(0)
    assert await bus.backend.rollup.sample_queues(minute, 1000) is True
    await bus.publish(OrderPlaced(order_id="after"))
    assert await bus.backend.rollup.sample_queues(minute, 1000) is False  # this minute has its sample
    assert await bus.backend.rollup.sample_queues(minute - 60, 2) is True  # counted no further than 2
    hour = await bus.throughput(window="1h")
    now, before = _at(hour.points, minute), _at(hour.points, minute - 60)
    assert now.depth == 8  # 4 pending for each of the two subscriptions, at the first sample
    assert now.lag_seconds is not None and 0 <= now.lag_seconds < 60
    assert before.depth == 4  # 2 for each, capped
    charge = hour.subscriptions["charge"]
    assert (_at(charge, minute).depth, _at(charge, minute).completed) == (4, 0)
    assert hour.points[0].depth is None and hour.handlers == []


@pytest.mark.pooler  # the pruner's lock across batches
async def test_retention_prunes_rollup_rows_of_old_minutes(bus) -> None:
    await _two_subscriptions(bus)
    old = [RollupRow("charge", _minute(3 * 1440 + i), completed=1, durations={3: 1}) for i in range(3)]
    assert await bus.backend.rollup.record([*old, RollupRow("charge", _minute(2), completed=5)]) == 4
    two_days = Retention(rollup_retention=timedelta(days=2), batch_size=2)
    dry = await bus.prune(dry_run=True, retention=two_days)
    assert dry.rollup_rows == 3
    report = await bus.prune(retention=two_days)
    assert report.rollup_rows == 3
    assert (await bus.prune(retention=two_days)).rollup_rows == 0
    assert sum(p.completed for p in (await bus.throughput(window="1h")).points) == 5
    kept = await bus.prune(retention=Retention(rollup_retention=None))
    assert kept.rollup_rows == 0
