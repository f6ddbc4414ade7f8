"""SQLite backend: one embedded file, short BEGIN IMMEDIATE transactions, polled wake-ups.

A :class:`SQLiteBackend` builds one session (:class:`._db.SQLiteDb`: the
writer and reader links to the file, checkpoints, this process's wake-ups)
and one object per port on it. Several processes may share one file: SQLite
serialises their writers, and a busy file is retried, never reported.

Differences from PostgreSQL: no ``connection=`` publishing (there is no
caller's transaction to join), claims serialise on the file's write lock
instead of skipping locked rows, and other processes' commits are noticed by
polling (every ``poll_interval_seconds``) instead of LISTEN/NOTIFY.
"""

from __future__ import annotations

from typing import Literal

from ..._priority import DEFAULT_PRIORITY_STEP_SECONDS
from ..base import Backend
from . import _dsn
from ._db import ListenerState, SQLiteDb
from .delivery import SQLiteDeliveries
from .inspect import SQLiteInspector
from .operate import SQLiteOperator
from .retention import SQLiteRetention
from .rollup import SQLiteRollup
from .schedules import SQLiteSchedules
from .schema import SQLiteSchema
from .wakeups import SQLiteWakeups
from .workflows import SQLiteWorkflows

__all__ = ["SQLiteBackend"]


class SQLiteBackend:
    """Stores the bus in one SQLite file, shared by any number of local processes.

    :param dsn: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``,
        optionally with ``?synchronous=NORMAL&busy_timeout_ms=5000`` (the same
        options as the keyword arguments, for CLIs and ``$EVENTBUS_DSN``).
    :param synchronous: ``"FULL"`` (default: a commit survives power loss) or
        ``"NORMAL"`` (faster; in WAL mode the last commits may be lost on power
        loss, never on a process crash, and the file is never corrupted).
    :param busy_timeout_ms: patience for another process's write lock (default
        30000): a call keeps waiting, in slices of at most 100 ms so that a
        cancelled call never waits on, for four times this (at least 5 s)
        before it raises :class:`~eventbus.BackendUnavailable`.
    :param poll_interval_seconds: how often the worker's poller checks for
        commits by other processes.
    :param migrate: apply pending migrations on open (and create the file)
        instead of refusing a file that is missing or not migrated.

    An option given both in the DSN and as a keyword argument must agree.
    """

    kind: Literal["sqlite"] = "sqlite"

    def __init__(
        self,
        dsn: str,
        *,
        synchronous: str | None = None,
        busy_timeout_ms: int | None = None,
        poll_interval_seconds: float = 0.05,
        migrate: bool = False,
        priority_step_seconds: float = DEFAULT_PRIORITY_STEP_SECONDS,
    ) -> None:
        options = _dsn.options(
            dsn,
            synchronous=synchronous,
            busy_timeout_ms=busy_timeout_ms,
            poll_interval_seconds=poll_interval_seconds,
            migrate=migrate,
            priority_step_seconds=priority_step_seconds,
        )
        self.dsn = dsn
        self.db = SQLiteDb(options)
        self.deliveries = SQLiteDeliveries(self.db)
        self.wakeups = SQLiteWakeups(self.db)
        self.inspect = SQLiteInspector(self.db)
        self.operate = SQLiteOperator(self.db)
        self.retention = SQLiteRetention(self.db)
        self.rollup = SQLiteRollup(self.db)
        self.schedules = SQLiteSchedules(self.db)
        self.workflows = SQLiteWorkflows(self.db)
        self.schema = SQLiteSchema(self.db)

    @property
    def listener(self) -> ListenerState:
        """Whether the poll for other processes' commits works (for the metrics)."""
        return self.db.listener

    async def open(self) -> None:
        """Connect; refuse a file that is missing or not migrated, unless ``migrate`` was asked for."""
        await self.db.open()

    async def aclose(self) -> None:
        await self.db.close()


_: type[Backend] = SQLiteBackend
