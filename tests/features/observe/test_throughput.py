"""Workers keep the throughput rollup: real deliveries, some failing, counted with their durations.

Both backends. A drain's worker flushes its rollup when it stops; a worker
flushes the minutes that have ended on its own every ten seconds (the
``Rollup`` tests below use a clock of their own for that).
"""

from __future__ import annotations

import time

import anyio

from eventbus import Context, DeadLetter, RetryPolicy
from eventbus.testing import drain
from eventbus.throughput import COMPLETED, DEAD, FAILED, Rollup, bucket_of
from eventbus.worker._upkeep import RollupTurns, flush_rollup

from ...support.helpers import OrderPlaced


async def test_a_worker_counts_completed_failed_and_dead_runs_with_their_durations(make_bus) -> None:
    bus = await make_bus()
    tries: dict[str, int] = {}

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        await anyio.sleep(0.02)

    @bus.subscribe(OrderPlaced, name="ship", retry=RetryPolicy(max_attempts=3, base_delay_seconds=0.01))
    async def ship(event: OrderPlaced, ctx: Context) -> None:
        tries[event.order_id] = tries.get(event.order_id, 0) + 1
        if event.order_id.startswith("lost"):
            raise DeadLetter("no address")
        if event.order_id.startswith("flaky") and tries[event.order_id] == 1:
            raise RuntimeError("carrier busy")

    ids = [f"ok-{i}" for i in range(6)] + ["flaky-1", "flaky-2", "lost-1"]
    await bus.publish_many([OrderPlaced(order_id=i) for i in ids])
    await drain(bus)
    hour = await bus.throughput(window="1h")
    handlers = {h.subscription: h for h in hour.handlers}
    assert (handlers["charge"].completed, handlers["charge"].failed, handlers["charge"].dead) == (9, 0, 0)
    assert (handlers["ship"].completed, handlers["ship"].failed, handlers["ship"].dead) == (8, 2, 1)
    charge_p50 = handlers["charge"].p50_seconds
    assert charge_p50 is not None and 0.018 < charge_p50 < 0.05  # a 20 ms handler, within a bucket
    assert handlers["ship"].p99_seconds is not None and handlers["ship"].p99_seconds < 0.02
    total = [p for p in hour.points if p.completed or p.failed or p.dead]
    assert sum(p.completed for p in total) == 17 and sum(p.dead for p in total) == 1
    assert all(p.p50_seconds is not None for p in total)


async def test_no_rollup_is_kept_when_it_is_turned_off(make_bus) -> None:
    bus = await make_bus(rollup=False)

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(5)])
    assert (await drain(bus)).processed == 5
    hour = await bus.throughput(window="1h")
    assert hour.handlers == [] and sum(p.completed for p in hour.points) == 0


async def test_a_flush_writes_the_minutes_that_ended_and_keeps_the_current_one(make_bus) -> None:
    bus = await make_bus()

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.register()
    now = [1_000_000_000 // 60 * 60 + 5.0]  # some minute's sixth second
    rollup = Rollup(clock=lambda: now[0])
    rollup.add("charge", COMPLETED, 0.001)
    rollup.add("charge", FAILED, 0.002)
    rollup.add("charge", DEAD, 0.003)
    await flush_rollup(bus.backend.rollup, rollup)
    assert len(rollup) == 1  # the minute has not ended: nothing written yet
    now[0] += 60
    rollup.add("charge", COMPLETED, 0.001)  # the next minute's
    (row,) = rollup.take()
    assert (row.minute, row.completed, row.failed, row.dead) == (now[0] - 65, 1, 1, 1)
    assert row.durations == {bucket_of(0.001): 1, bucket_of(0.002): 1, bucket_of(0.003): 1}
    rollup.put_back([row])  # as a refused flush does: counted again, merged
    rollup.add("charge", COMPLETED, 0.001)
    assert len(rollup) == 2
    rows = rollup.take(everything=True)
    assert sorted((r.minute, r.completed) for r in rows) == [(now[0] - 65, 1), (now[0] - 5, 2)]
    assert await bus.backend.rollup.record(rows) == 2


async def test_a_serving_worker_samples_the_queues_once_a_minute(make_bus) -> None:
    """The upkeep turn: flush what ended, then the minute's queue sample, once."""
    bus = await make_bus()

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(4)])
    turns = RollupTurns(bus.backend.rollup, Rollup(), sample=True)
    await turns.turn()
    sampled = turns.sampled_minute
    assert sampled == int(time.time()) // 60 * 60 or sampled == int(time.time()) // 60 * 60 - 60
    await bus.publish(OrderPlaced(order_id="more"))
    await turns.turn()  # the same minute (most likely): nothing more is written
    hour = await bus.throughput(window="1h")
    depths = [p.depth for p in hour.points if p.depth is not None]
    assert depths[0] == 4 and all(d in (4, 5) for d in depths)
    burst = RollupTurns(bus.backend.rollup, Rollup(), sample=False)
    await burst.turn()
    assert burst.sampled_minute == -1  # a drain takes no sample
