"""The wake-up port on PostgreSQL: LISTEN on the schema's channel, or a short poll, and local pushes."""

from __future__ import annotations

import logging

import anyio

from .._wakeup import SWEEP, QuietFeed, Waker, WakerFeed
from ..ports import ChangeFeed
from ._listener import PostgresListener

__all__ = ["PgWakeups", "PollingWaker"]

log = logging.getLogger("eventbus.listener")


class PollingWaker(Waker):
    """Wake-ups without LISTEN: every subscription is swept every ``interval_seconds``.

    For a bus behind a transaction pooler with no direct connection for
    LISTEN (``listen_dsn``): a LISTEN through such a pooler lands on whichever
    server connection is free and hears nothing. Publishes of this process
    still wake its worker at once (``wake_local``); those of other processes
    are found by the next sweep, one claim query per subscription each time.
    """

    def __init__(self, interval_seconds: float) -> None:
        super().__init__()
        self.interval_seconds = interval_seconds
        self.healthy = False
        self.reconnects = 0

    async def run(self) -> None:
        """Sweep every interval until cancelled."""
        log.warning(
            "no LISTEN behind a transaction pooler: polling for work every %gs "
            "(give listen_dsn= a direct connection for wake-ups)",
            self.interval_seconds,
        )
        self.healthy = True
        try:
            while True:
                self.push({SWEEP})
                await anyio.sleep(self.interval_seconds)
        finally:
            self.healthy = False


class PgWakeups:
    """:class:`~eventbus.backends.ports.Wakeups` over one LISTEN connection (see ``_listener``).

    Every publish, release, recovery and resume sends a NOTIFY with the event
    type on the schema's channel; the listener turns it into a wake-up. With
    no ``listen_dsn`` (the bus is behind a transaction pooler and has no
    direct connection), a :class:`PollingWaker` sweeps instead.
    """

    def __init__(self, listen_dsn: str | None, channel: str, poll_interval_seconds: float) -> None:
        self.listener: PostgresListener | PollingWaker = (
            PostgresListener(listen_dsn, channel)
            if listen_dsn is not None
            else PollingWaker(poll_interval_seconds)
        )

    @property
    def healthy(self) -> bool:
        """Whether the LISTEN connection is up and heard its last probe (or the poll runs)."""
        return self.listener.healthy

    @property
    def reconnects(self) -> int:
        """How many times the LISTEN connection was lost since the process started."""
        return self.listener.reconnects

    async def run(self) -> None:
        """Keep the LISTEN connection (or the poll) alive until cancelled (see ``Wakeups.run``)."""
        await self.listener.run()

    async def wait(self, timeout: float) -> set[str]:
        """Event types woken since the last call, or empty after ``timeout`` (see ``Wakeups.wait``)."""
        return await self.listener.wait(timeout)

    def wake_local(self, event_types: set[str]) -> None:
        """Wake this process's worker without a round trip to the database."""
        self.listener.push(event_types)

    def observe(self) -> ChangeFeed:
        """A feed of changes over a LISTEN connection of its own (see ``Wakeups.observe``).

        Without ``listen_dsn`` there is nothing to listen on: the feed stays
        quiet and the watcher's own looks find the changes.
        """
        if isinstance(self.listener, PostgresListener):
            return WakerFeed(PostgresListener(self.listener.dsn, self.listener.channel))
        return QuietFeed()
