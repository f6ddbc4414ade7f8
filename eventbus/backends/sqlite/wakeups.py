"""The :class:`~eventbus.backends.base.Wakeups` port on SQLite: polled, not notified.

Commits of this process wake its worker directly; commits of other processes
are noticed by polling ``PRAGMA data_version`` on the reader link every
``poll_interval_seconds`` (SQLite has no LISTEN/NOTIFY), which wakes every
subscription.
"""

from __future__ import annotations

import logging

import anyio

from ...errors import BackendError
from .._wakeup import SWEEP, Waker
from ..ports import ChangeFeed
from ._db import SQLiteDb

__all__ = ["OBSERVE_INTERVAL_SECONDS", "SQLiteChangeFeed", "SQLiteWakeups"]

OBSERVE_INTERVAL_SECONDS = 0.25
"""The shortest time between two looks at the file's commit counter by a change feed."""

log = logging.getLogger("eventbus.sqlite")


class SQLiteWakeups:
    """This process's wake-ups, and the poll for other processes' commits."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def run(self) -> None:
        """Poll ``PRAGMA data_version``; sweep when another connection committed."""
        last, failures = None, 0
        listener = self._db.listener
        while True:
            try:
                version = (await self._db.fetch("data_version"))[0][0]
            except BackendError as exc:
                log.warning("polling %s for commits failed: %s", self._db.path, exc)
                listener.healthy, failures = False, failures + 1
                listener.reconnects += 1
                await anyio.sleep(min(5.0, 0.1 * 2**failures))
                continue
            listener.healthy, failures = True, 0
            if version != last:
                self.wake_local({SWEEP})  # the first poll sweeps whatever was missed
                last = version
            await anyio.sleep(self._db.options.poll_interval_seconds)

    async def wait(self, timeout: float) -> set[str]:
        return await self._db.wait(timeout)

    def wake_local(self, event_types: set[str]) -> None:
        """Wake this process's worker without touching the database."""
        self._db.wake(event_types)

    def observe(self) -> ChangeFeed:
        """A feed of commits to the file, by any connection (see ``Wakeups.observe``)."""
        interval = max(self._db.options.poll_interval_seconds, OBSERVE_INTERVAL_SECONDS)
        return SQLiteChangeFeed(self._db, interval)


class SQLiteChangeFeed:
    """Looks at ``PRAGMA data_version`` on the reader link every ``interval`` seconds.

    The counter moves when any other connection commits, this process's
    writer link included, so one look answers for every writer of the file.
    """

    def __init__(self, db: SQLiteDb, interval: float) -> None:
        self._db = db
        self.interval = interval
        self.healthy = False
        self._waker = Waker()

    async def run(self) -> None:
        """Look until cancelled; the first look only sets where changes count from."""
        last, failures = None, 0
        while True:
            try:
                version = (await self._db.fetch("data_version"))[0][0]
            except BackendError as exc:
                log.warning("watching %s for commits failed: %s", self._db.path, exc)
                self.healthy, failures = False, failures + 1
                await anyio.sleep(min(5.0, 0.1 * 2**failures))
                continue
            self.healthy, failures = True, 0
            if last is not None and version != last:
                self._waker.push({SWEEP})
            last = version
            await anyio.sleep(self.interval)

    async def changed(self, timeout: float) -> bool:
        return bool(await self._waker.wait(timeout))
