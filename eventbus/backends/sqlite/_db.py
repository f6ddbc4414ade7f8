"""The SQLite backend's session: the links to the file, how units of work run, wake-up state.

Each backend holds two links to the file, each driven from a worker thread one
call at a time: the *writer* runs every write transaction as one synchronous
function (see :func:`._link.write`), so no handler or other coroutine ever
runs while the write lock is held; the *reader* serves the inspections, polls
``PRAGMA data_version`` for commits by other processes, and checkpoints the
WAL (TRUNCATE: every 1,000 commits, at each worker heartbeat, and as soon as a
commit finds the WAL past 16 MiB, which keeps it near that size under
sustained writes even when some reader is always in the file).

Every port object of the backend holds the one :class:`SQLiteDb` and runs its
work through :meth:`~SQLiteDb.write`, :meth:`~SQLiteDb.write_if` and
:meth:`~SQLiteDb.read`.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ...errors import BackendUnavailable, ConfigurationError
from .. import _migrations as migrations
from .._sql import load_queries, with_priority_step
from .._wakeup import Waker
from . import _link
from ._dsn import Options
from ._link import Link, Queries
from ._migrate import applied_migrations, apply_next_migration, pending

__all__ = ["ListenerState", "SQLiteDb"]

log = logging.getLogger("eventbus.sqlite")

T = TypeVar("T")

_MIN_VERSION = (3, 35, 0)  # UPDATE … RETURNING
_READER_BUSY_TIMEOUT_MS = 250  # short, so a checkpoint never stalls the poller
_CHECKPOINT_EVERY_WRITES = 1000
# Truncate the WAL once a commit finds it past this size. The automatic
# PASSIVE checkpoints copy pages but cannot rewind a WAL that some reader is
# always in, so under sustained writes it would grow without bound.
_CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024


class ListenerState:
    """Whether the poll for other processes' commits works, and how often it failed."""

    def __init__(self) -> None:
        self.healthy = False
        self.reconnects = 0


class SQLiteDb:
    """The file, its writer and reader links, and this process's wake-ups."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.path = options.path
        self.q: Queries = with_priority_step(load_queries("sqlite", "main"), options.priority_step_seconds)
        self.listener = ListenerState()
        self.writer: Link | None = None
        """The writer link while the backend is open."""
        self._reader: Link | None = None
        self._migrated = False
        self._writes = 0
        self._wal_path = f"{self.path}-wal"
        self._wal_bytes = 0  # size of the WAL after this process's last commit
        self._open_lock = anyio.Lock()
        self._waker = Waker()
        self.handler_turn = anyio.Lock()
        """Taken by a transactional handler before the writer link (see ``_transaction``)."""

    # -- lifecycle -------------------------------------------------------

    async def open(self) -> None:
        """Connect; refuse a file that is missing or not migrated, unless ``migrate`` was asked for.

        A missing file is never created here, so a read-only command on a
        mistyped path says so instead of leaving an empty database behind.
        """
        if self._migrated:
            return
        async with self._open_lock:
            if self._migrated:
                return
            if not self.options.migrate and not await anyio.Path(self.path).exists():
                raise migrations.not_migrated(f"no eventbus database at {self.path}", [])
            writer = await self._connect()
            await self._check_migrated(writer)
            self._migrated = True

    async def _check_migrated(self, writer: Link) -> None:
        q, deadline = self.q, writer.deadline_seconds

        def read_applied(conn: sqlite3.Connection) -> dict[int, str] | None:
            return _link.read(conn, lambda c: applied_migrations(c, q), deadline)

        applied = await writer.run(read_applied)
        todo = pending(applied)
        if todo and not self.options.migrate:
            raise migrations.not_migrated(f"SQLite database {self.path}", [] if applied is None else todo)
        if todo:
            await self._apply_migrations(writer)

    async def migrate(self) -> list[str]:
        """Apply pending migrations, one BEGIN IMMEDIATE transaction per file."""
        async with self._open_lock:
            names = await self._apply_migrations(await self._connect())
            self._migrated = True
        return names

    async def _apply_migrations(self, writer: Link) -> list[str]:
        names: list[str] = []
        while (name := await self._write_on(writer, apply_next_migration)) is not None:
            names.append(name)
        return names

    async def _connect(self) -> Link:
        """The writer link, connecting both links first if needed (under _open_lock)."""
        if self.writer is not None:
            return self.writer
        if sqlite3.sqlite_version_info < _MIN_VERSION:
            raise ConfigurationError(
                f"SQLite {sqlite3.sqlite_version} is too old: eventbus needs 3.35 or newer"
            )
        writer = await self._new_link(self.options.busy_timeout_ms)
        try:
            await writer.run(_link.enable_wal)
            self._reader = await self._new_link(_READER_BUSY_TIMEOUT_MS)
        except BaseException:
            await writer.close()
            raise
        self.writer = writer
        return writer

    async def _new_link(self, busy_timeout_ms: int) -> Link:
        o = self.options
        return await Link.open(o.path, o.synchronous, busy_timeout_ms, o.lock_deadline_seconds)

    async def close(self) -> None:
        """Close both links; the next call opens them again."""
        writer, reader = self.writer, self._reader
        self.writer = self._reader = None
        self._migrated = False
        for link in (reader, writer):
            if link is not None:
                await link.close()

    async def _link(self, *, reader: bool = False) -> Link:
        await self.open()
        link = self._reader if reader else self.writer
        if link is None:
            raise BackendUnavailable("the SQLite backend was closed")
        return link

    # -- running units of work ----------------------------------------------

    @contextlib.asynccontextmanager
    async def held_writer(self) -> AsyncIterator[tuple[Link, Callable[..., Awaitable[Any]]]]:
        """The writer link held across awaits, and the call that runs a unit on it (see ``Link.held``)."""
        link = await self._link()
        async with link.held() as call:
            yield link, call

    async def write(self, body: Callable[..., T], *args: Any) -> T:
        """Run ``body(conn, q, now, *args)`` as one write transaction."""
        return await self._write_on(await self._link(), body, *args)

    async def _write_on(self, link: Link, body: Callable[..., T], *args: Any) -> T:
        result = await link.run(self._transaction(link, body, args))
        await self.wrote()
        return result

    async def write_if(
        self, probe: str, params: dict[str, Any], body: Callable[..., T], *args: Any
    ) -> T | None:
        """As :meth:`write`, only when the autocommit query ``probe`` finds a row.

        Spares the file's write lock, which every process contends for, when
        there is nothing to do.
        """
        link = await self._link()
        sql, deadline = self.q[probe], link.deadline_seconds
        transaction = self._transaction(link, body, args)

        def unit(conn: sqlite3.Connection) -> T | None:
            if _link.read(conn, lambda c: c.execute(sql, params).fetchone(), deadline) is None:
                return None
            return transaction(conn)

        result = await link.run(unit)
        if result is not None:
            await self.wrote()
        return result

    def _transaction(
        self, link: Link, body: Callable[..., T], args: tuple[Any, ...]
    ) -> Callable[[sqlite3.Connection], T]:
        q, deadline = self.q, link.deadline_seconds

        def unit(conn: sqlite3.Connection) -> T:
            result = _link.write(conn, q, lambda c, now: body(c, q, now, *args), deadline)
            self._wal_bytes = _link.file_size(self._wal_path)  # still on the link's thread
            return result

        return unit

    async def wrote(self) -> None:
        """Count commits; truncate the WAL every so often and whenever it grew past its bound."""
        self._writes += 1
        if self._wal_bytes > _CHECKPOINT_WAL_BYTES or self._writes % _CHECKPOINT_EVERY_WRITES == 0:
            self._wal_bytes = 0
            await self.checkpoint()

    async def checkpoint(self) -> None:
        """Truncate the WAL on the reader link; a busy file only postpones it."""
        if not await self.read(_link.checkpoint):
            log.debug("WAL checkpoint of %s deferred: a reader or writer was in the way", self.path)

    async def read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``body(conn)`` on the reader link (autocommit statements), retried while busy."""
        link = await self._link(reader=True)
        deadline = link.deadline_seconds
        return await link.run(lambda conn: _link.read(conn, body, deadline))

    async def fetch(self, name: str, params: Any = ()) -> list[sqlite3.Row]:
        """Every row of the named query, on the reader link."""
        sql = self.q[name]
        return await self.read(lambda c: c.execute(sql, params).fetchall())

    # -- wake-ups of this process ----------------------------------------

    def wake(self, event_types: set[str]) -> None:
        """Wake this process's waiting worker for ``event_types`` (nothing when empty)."""
        if event_types:
            self._waker.push(event_types)

    async def wait(self, timeout: float) -> set[str]:
        """The event types woken since the last call, or an empty set after ``timeout``."""
        return await self._waker.wait(timeout)
