"""The wake-up port on PostgreSQL: LISTEN on the schema's channel, and local pushes."""

from __future__ import annotations

from ._db import PgDb
from ._listener import PostgresListener

__all__ = ["PgWakeups"]


class PgWakeups:
    """:class:`~eventbus.backends.ports.Wakeups` over one LISTEN connection (see ``_listener``).

    Every publish, release, recovery and resume sends a NOTIFY with the event
    type on the schema's channel; the listener turns it into a wake-up.
    """

    def __init__(self, db: PgDb) -> None:
        self.listener = PostgresListener(db.dsn, db.channel)

    @property
    def healthy(self) -> bool:
        """Whether the LISTEN connection is up and heard its last probe."""
        return self.listener.healthy

    @property
    def reconnects(self) -> int:
        """How many times the LISTEN connection was lost since the process started."""
        return self.listener.reconnects

    async def run(self) -> None:
        """Keep the LISTEN connection alive until cancelled (see ``Wakeups.run``)."""
        await self.listener.run()

    async def wait(self, timeout: float) -> set[str]:
        """Event types woken since the last call, or empty after ``timeout`` (see ``Wakeups.wait``)."""
        return await self.listener.wait(timeout)

    def wake_local(self, event_types: set[str]) -> None:
        """Wake this process's worker without a round trip to the database."""
        self.listener.push(event_types)
