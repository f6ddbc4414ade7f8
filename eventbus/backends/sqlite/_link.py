"""Connections of the SQLite backend: opening, busy retries, error mapping.

A :class:`Link` is one sqlite3 connection driven from a worker thread, one
call at a time. :func:`write` runs a whole unit of work in one ``BEGIN
IMMEDIATE`` transaction (the write lock is taken before anything is read, so
two writers can never deadlock upgrading a read lock) with one time stamp from
the database clock. A busy file is retried with backoff until a deadline;
"database is locked" never reaches a caller.

A caller that is cancelled returns at once: its unit, if still waiting for the
file's lock, is abandoned at the next slice of the wait (SQLite waits at most
:data:`BUSY_SLICE_MS` at a time), and one that got the lock after its caller
left rolls back before writing anything.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiosqlite
import anyio

from ...errors import BackendError, BackendUnavailable, EventBusError, SchemaNotMigrated
from ._dsn import SYNCHRONOUS

__all__ = [
    "BUSY_SLICE_MS",
    "Link",
    "Queries",
    "begin",
    "checkpoint",
    "configure",
    "connection_thread",
    "enable_wal",
    "file_size",
    "is_busy",
    "read",
    "translate_errors",
    "write",
]

log = logging.getLogger("eventbus.sqlite")

T = TypeVar("T")
Queries = dict[str, str]

_CANTOPEN = 14
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary result codes)
BUSY_SLICE_MS = 100
"""Longest wait inside SQLite for another connection's lock; the busy retries
continue it up to the deadline, checking between slices whether the caller left."""
_current = threading.local()  # the unit a link's thread is running
_SYNCHRONOUS = {level: f"PRAGMA synchronous = {level}" for level in SYNCHRONOUS}


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` means another connection holds a lock we need."""
    return isinstance(exc, sqlite3.OperationalError) and (
        getattr(exc, "sqlite_errorcode", 0) & 0xFF in _BUSY_CODES or "database is locked" in str(exc)
    )


# -- connections --------------------------------------------------------------


def configure(conn: sqlite3.Connection, synchronous: str) -> None:
    """Settings of every connection (autocommit mode: transactions are explicit)."""
    conn.row_factory = sqlite3.Row
    conn.execute(_SYNCHRONOUS[synchronous])
    # After a checkpoint resets the WAL, truncate the file back to 64 MiB.
    conn.execute("PRAGMA journal_size_limit = 67108864")


def enable_wal(conn: sqlite3.Connection) -> str:
    """Switch the file to WAL (persistent): readers never block the writer."""
    mode: str = read(conn, lambda c: c.execute("PRAGMA journal_mode = WAL").fetchone()[0], 30.0)
    if mode.lower() != "wal":
        log.warning("SQLite refused WAL mode (%s); concurrent access will be slower", mode)
    return mode


_CHECKPOINT_SLICES = 3
"""Busy waits of one slice each a checkpoint may spend on readers in the way:
the connection waits one slice at a time (cancellation), and a TRUNCATE
checkpoint needs a moment with no reader in the file."""


def checkpoint(conn: sqlite3.Connection) -> bool:
    """Copy the WAL into the database and truncate it; False when something was in the way.

    Run on a connection with a short busy timeout: under load this is what keeps
    the WAL from growing (the automatic PASSIVE checkpoints may never catch up),
    and a busy file only postpones it.
    """
    for _ in range(_CHECKPOINT_SLICES):
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            busy = True
        if not busy:
            return True
    return False


def file_size(path: str) -> int:
    """Size of a file in bytes, 0 when it does not exist."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _backoff(attempt: int) -> float:
    return random.uniform(0.5, 1.0) * min(0.25, 0.005 * 2.0**attempt)


class _Abandoned(Exception):
    """The caller of a unit was cancelled before the unit wrote anything."""


class _Unit:
    """One call queued on a link's thread; its caller may leave before it runs."""

    def __init__(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        self.fn = fn
        self.abandoned = False

    def __call__(self, conn: sqlite3.Connection) -> Any:
        _current.unit = self
        try:
            _check_abandoned()
            return self.fn(conn)
        finally:
            _current.unit = None


def _check_abandoned() -> None:
    unit = getattr(_current, "unit", None)
    if unit is not None and unit.abandoned:
        raise _Abandoned


def _retry_busy(body: Callable[[], T], deadline_seconds: float) -> T:
    deadline = time.monotonic() + deadline_seconds
    attempt = 0
    while True:
        _check_abandoned()
        try:
            return body()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            if time.monotonic() >= deadline:
                raise BackendUnavailable(
                    f"the SQLite database stayed locked for {deadline_seconds:.0f}s "
                    "(another process holds a long write transaction?)"
                ) from exc
        attempt += 1
        time.sleep(_backoff(attempt))


def read(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T], deadline_seconds: float) -> T:
    """Run a read (autocommit statements), retrying while the file is busy."""
    return _retry_busy(lambda: body(conn), deadline_seconds)


def begin(conn: sqlite3.Connection, deadline_seconds: float) -> None:
    """Open a BEGIN IMMEDIATE transaction that the caller ends, retried while the file is busy."""
    _retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"), deadline_seconds)


def write(
    conn: sqlite3.Connection,
    q: Queries,
    body: Callable[[sqlite3.Connection, float], T],
    deadline_seconds: float,
) -> T:
    """Run ``body(conn, now)`` in one BEGIN IMMEDIATE transaction, retried while busy."""

    def once() -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            _check_abandoned()  # the lock came after the caller left: write nothing
            now: float = conn.execute(q["now"]).fetchone()[0]
            result = body(conn, now)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    return _retry_busy(once, deadline_seconds)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Map sqlite3 errors to eventbus errors, keeping the cause."""
    try:
        yield
    except EventBusError:
        raise
    except sqlite3.OperationalError as exc:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if "no such table" in str(exc):
            raise SchemaNotMigrated(f"{SchemaNotMigrated.__doc__} ({exc})") from exc
        if code == _CANTOPEN or "unable to open" in str(exc):
            raise BackendUnavailable(f"cannot open the SQLite database: {exc}") from exc
        if is_busy(exc):
            raise BackendUnavailable(f"the SQLite database is busy: {exc}") from exc
        raise BackendError(f"SQLite refused the operation: {exc}") from exc
    except sqlite3.Error as exc:
        raise BackendError(f"SQLite refused the operation: {exc}") from exc


def run_on_connection_thread(db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> Awaitable[T]:
    """Queue ``fn(connection)`` on aiosqlite's connection thread as one call.

    A unit of work (a whole ``BEGIN IMMEDIATE`` … ``COMMIT``) must run on that
    thread without returning to the event loop in between, so the write lock
    is never held across an await. aiosqlite has no public call for that, so
    this is the one place that uses its internal queueing method; the test
    ``tests/unit/test_sqlite_driver.py`` fails first if a release changes it.
    """
    execute: Callable[..., Awaitable[T]] = db._execute
    return execute(fn, db._conn)


def connection_thread(db: aiosqlite.Connection) -> threading.Thread:
    """The thread aiosqlite runs ``db`` on (an attribute since 0.22, the connection itself before)."""
    thread = getattr(db, "_thread", db)
    if not isinstance(thread, threading.Thread):
        raise TypeError(f"aiosqlite {aiosqlite.__version__}: cannot find the connection's thread")
    return thread


async def _joined(db: aiosqlite.Connection) -> None:
    """Wait for the thread of a connection that failed to open to end.

    aiosqlite stops that thread without waiting for it; left running, it
    reports to an event loop that may be closed by then (``eventbus migrate``
    on a path that cannot be opened exits with a thread's traceback).
    """
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(connection_thread(db).join)


class Link:
    """One aiosqlite connection. Its own thread runs each unit of work whole.

    aiosqlite executes every call on the connection's dedicated thread, in
    order. A unit of work (a whole ``BEGIN IMMEDIATE`` … ``COMMIT``) is queued
    there as one call, so the write lock is never held across an await of the
    event loop. A cancelled caller returns at once and its unit is abandoned
    unless it already holds the lock (then it finishes: it is short). Work
    that must not be lost to a cancellation (a claim, a result) is shielded
    by its caller.
    """

    def __init__(self, db: aiosqlite.Connection, deadline_seconds: float) -> None:
        self.db = db
        self.deadline_seconds = deadline_seconds
        self._lock = anyio.Lock()

    @classmethod
    async def open(cls, path: str, synchronous: str, busy_timeout_ms: int, deadline_seconds: float) -> Link:
        connecting = aiosqlite.connect(
            path,
            timeout=min(busy_timeout_ms, BUSY_SLICE_MS) / 1000,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=256,
        )
        try:
            with translate_errors():
                db = await connecting
        except BaseException:
            await _joined(connecting)
            raise
        link = cls(db, deadline_seconds)
        try:
            await link.run(functools.partial(configure, synchronous=synchronous))
        except BaseException:
            await link.close()
            raise
        return link

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._lock:
            return await self._call(fn)

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        unit = _Unit(fn)
        result: T
        try:
            with translate_errors():
                result = await run_on_connection_thread(self.db, unit)
        except anyio.get_cancelled_exc_class():
            unit.abandoned = True
            raise
        return result

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]]:
        """The link to oneself across awaits: yields the call that runs a unit on it.

        Every other user of the link (this process's writes) waits for the
        block to end, in turn, on the link's lock, rather than spinning on the
        file's lock in SQLite.
        """
        async with self._lock:
            yield self._call

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await self.db.close()
