"""In-process wake-ups shared by both backends."""

from __future__ import annotations

import anyio

__all__ = ["SWEEP", "Waker"]

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
