"""The worker's capacity and dispatch queue: who is woken, and when."""

from __future__ import annotations

import anyio
import anyio.lowlevel

from eventbus.worker._claims import Slots
from eventbus.worker._queue import DispatchQueue


async def _settle() -> None:
    for _ in range(5):
        await anyio.lowlevel.checkpoint()


async def test_a_claim_loop_waiting_for_half_the_slots_is_woken_once_they_are_free() -> None:
    slots, got = Slots(4), []
    for _ in range(4):
        slots.take()

    async def wait() -> None:
        got.append(await slots.wait_for(2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await _settle()
        slots.free()  # one free: not enough
        await _settle()
        assert got == []
        slots.free()
        await _settle()
        assert got == [2]
    slots.free()
    slots.free()  # nobody waits: nothing to wake, nothing breaks
    assert slots.running == 0
    with anyio.fail_after(1):
        assert await slots.wait_for(4) == 4  # enough free already: no wait


async def test_the_stop_waits_until_every_slot_is_free() -> None:
    slots, done = Slots(3), []
    for _ in range(2):
        slots.take()

    async def idle() -> None:
        await slots.wait_until_idle()
        done.append(slots.running)

    async with anyio.create_task_group() as tg:
        tg.start_soon(idle)
        await _settle()
        slots.free()
        await _settle()
        assert done == []
        slots.free()
    assert done == [0]


async def test_each_item_wakes_one_waiting_getter_and_a_cancelled_one_is_passed_over() -> None:
    queue: DispatchQueue[int] = DispatchQueue()
    got: list[int] = []
    scopes: list[anyio.CancelScope] = []

    async def get() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            got.append(await queue.get())

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(get)
        await _settle()
        scopes[0].cancel()  # the first in line leaves (a runner stopping)
        await _settle()
        queue.put(1)
        queue.put(2)
    assert sorted(got) == [1, 2]
    queue.put(3)
    assert queue.take_all() == [3]
