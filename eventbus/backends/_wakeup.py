"""In-process wake-ups shared by both backends."""

from __future__ import annotations

from typing import Protocol

import anyio

__all__ = ["SWEEP", "QuietFeed", "Waker", "WakerFeed"]

SWEEP = "*"
"""Pseudo event type: wake every subscription."""


class Waker:
    """In-process wake-ups: event types pushed here end the worker's wait."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._wake = anyio.Event()

    def push(self, event_types: set[str]) -> None:
        self._pending |= event_types
        self._wake.set()

    async def wait(self, timeout: float) -> set[str]:
        """Return the event types pushed since the last call (empty on timeout)."""
        if not self._pending:
            with anyio.move_on_after(max(timeout, 0.0)):
                await self._wake.wait()
        woken, self._pending = self._pending, set()
        self._wake = anyio.Event()
        return woken


class _Source(Protocol):
    healthy: bool
    reconnects: int

    async def run(self) -> None: ...

    async def wait(self, timeout: float) -> set[str]: ...


class WakerFeed:
    """A :class:`~eventbus.backends.ports.ChangeFeed` over a wake-up source of its own (a LISTEN connection).

    The sweep a source asks for when it first connects is no change: it is
    left out. The sweep after a reconnect is one (hints may have been lost).
    """

    def __init__(self, source: _Source) -> None:
        self.source = source

    @property
    def healthy(self) -> bool:
        return self.source.healthy

    async def run(self) -> None:
        await self.source.run()

    async def changed(self, timeout: float) -> bool:
        with anyio.move_on_after(max(timeout, 0.0)):
            while True:
                woken = await self.source.wait(timeout)
                if woken and (woken != {SWEEP} or self.source.reconnects > 0):
                    return True
        return False


class QuietFeed:
    """A change feed with no source (PostgreSQL behind a transaction pooler, no LISTEN): it never hints."""

    healthy = True

    async def run(self) -> None:
        await anyio.sleep_forever()

    async def changed(self, timeout: float) -> bool:
        await anyio.sleep(max(timeout, 0.0))
        return False
