"""``Wakeups.observe``: a watcher's own feed of change hints, beside the worker's wake-ups."""

from __future__ import annotations

import anyio

from eventbus import Bus

from ...conftest import BusFactory
from ...support.helpers import OrderPlaced


async def test_a_change_feed_hears_writes_and_not_its_own_start(bus: Bus, make_bus: BusFactory) -> None:
    other = await make_bus()
    feed = bus.changes()
    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.run)
        with anyio.fail_after(5):
            while not feed.healthy:
                await anyio.sleep(0.02)
        assert not await feed.changed(0.6)  # connecting (and its look at the file) is no change
        await other.publish(OrderPlaced(order_id="seen"))
        with anyio.fail_after(3):
            assert await feed.changed(3)
        await bus.publish(OrderPlaced(order_id="mine"))  # this bus's own writes are hinted too
        with anyio.fail_after(3):
            assert await feed.changed(3)
        tg.cancel_scope.cancel()


async def test_two_feeds_each_hear_a_change_and_the_workers_wake_ups_are_left_alone(
    bus: Bus, make_bus: BusFactory
) -> None:
    other = await make_bus()
    feeds = [bus.changes(), bus.changes()]
    woken: list[set[str]] = []
    async with anyio.create_task_group() as tg:
        for feed in feeds:
            tg.start_soon(feed.run)
        tg.start_soon(bus.backend.wakeups.run)
        with anyio.fail_after(5):
            while not all(f.healthy for f in feeds):
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)
        await bus.backend.wakeups.wait(0)  # the worker side's first sweep, from its own start
        await other.publish(OrderPlaced(order_id="for-everyone"))
        with anyio.fail_after(3):
            assert [await f.changed(3) for f in feeds] == [True, True]
            woken.append(await bus.backend.wakeups.wait(3))
        tg.cancel_scope.cancel()
    assert woken[0]  # the worker's wait still hears it: the feeds took nothing from it
