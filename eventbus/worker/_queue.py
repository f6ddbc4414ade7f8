"""The runners' dispatch queue."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["DispatchQueue"]

T = TypeVar("T")


class DispatchQueue(Generic[T]):
    """An unbounded FIFO whose ``get`` does not yield when an item is ready.

    A memory object stream checkpoints on every receive; at tens of thousands
    of deliveries a second that was the worker's largest cost. A waiting
    ``get`` waits on a bare future of the running loop (the bus's drivers,
    asyncpg and aiosqlite, run on asyncio only): an event object per wait,
    made and set once per delivery, cost more than the rest of the queue.
    A waiter cancelled meanwhile (a stopping runner) is passed over.
    """

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()

    def put(self, item: T) -> None:
        self._items.append(item)
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def get(self) -> T:
        items = self._items
        while not items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        return items.popleft()

    def take_all(self) -> list[T]:
        items = list(self._items)
        self._items.clear()
        return items
