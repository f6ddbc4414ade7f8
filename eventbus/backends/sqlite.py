"""SQLite backend: one embedded file, short BEGIN IMMEDIATE transactions, polled wake-ups.

Each backend holds two connections to the file, each driven from a worker
thread one call at a time: the *writer* runs every write transaction as one
synchronous function (see :mod:`._sqlite_sync`), so no handler or other
coroutine ever runs while the write lock is held; the *reader* serves status
and dead-letter queries, polls ``PRAGMA data_version`` for commits by other
processes, and checkpoints the WAL. Several processes may share one file:
SQLite serialises their writers, and a busy file is retried, never reported.

Differences from PostgreSQL: no ``connection=`` publishing (there is no
caller's transaction to join), claims serialise on the file's write lock
instead of skipping locked rows, and other processes' commits are noticed by
polling (every ``poll_interval_seconds``) instead of LISTEN/NOTIFY.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sqlite3
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import orjson

from . import _sqlite_sync as sync
from ..errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    EventBusError,
    NotFound,
    SchemaNotMigrated,
)
from ..sql import load_queries
from .base import (
    AttemptRecord,
    ClaimedDelivery,
    Completion,
    DeadLetterFilter,
    DeliveryDetail,
    DeliveryId,
    EventId,
    Failure,
    OutgoingEvent,
    PublishResult,
    StatusReport,
    SubscriptionSpec,
)
from .listener import SWEEP

__all__ = ["SQLiteBackend", "parse_dsn"]

log = logging.getLogger("eventbus.sqlite")

T = TypeVar("T")

_MIN_VERSION = (3, 35, 0)  # UPDATE … RETURNING
_CANTOPEN = 14
_READER_BUSY_TIMEOUT_MS = 250  # short, so a checkpoint never stalls the poller


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
        if sync.is_busy(exc):
            raise BackendUnavailable(f"the SQLite database is busy: {exc}") from exc
        raise BackendError(f"SQLite refused the operation: {exc}") from exc
    except sqlite3.Error as exc:
        raise BackendError(f"SQLite refused the operation: {exc}") from exc


def parse_dsn(dsn: str) -> str:
    """Return the absolute file path of ``sqlite:///relative.db`` or ``sqlite:////abs.db``."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme != "sqlite" or parts.netloc or parts.query or parts.fragment:
        raise ConfigurationError(
            f"invalid SQLite DSN {dsn!r}: use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db (options are keyword arguments, not query strings)"
        )
    path = urllib.parse.unquote(parts.path[1:])
    if not path or path == ":memory:":
        raise ConfigurationError(
            f"invalid SQLite DSN {dsn!r}: name a file (an in-memory database cannot be "
            "shared by the connections and processes of a bus; use a temporary file)"
        )
    return os.path.abspath(path)


def _time(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC)


def _epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _headers(text: str | None) -> dict[str, str]:
    if not text or text == "{}":
        return {}
    value = orjson.loads(text)
    return value if isinstance(value, dict) else {}


def _detail(row: sqlite3.Row, history: Sequence[AttemptRecord] = ()) -> DeliveryDetail:
    return DeliveryDetail(
        id=DeliveryId(row["id"]), event_id=EventId(row["event_id"]),
        subscription=row["subscription"], event_type=row["event_type"], status=row["status"],
        attempts=row["attempts"], key=row["key"], payload=bytes(row["payload"]),
        headers=_headers(row["headers"]), correlation_id=row["correlation_id"],
        causation_id=row["causation_id"], last_error=row["last_error"], replays=row["replays"],
        run_at=_time(row["run_at"]), updated_at=_time(row["updated_at"]),
        created_at=_time(row["created_at"]), history=history,
    )


def _attempt(row: sqlite3.Row) -> AttemptRecord:
    return AttemptRecord(
        attempt=row[0], error_type=row[1], message=row[2], traceback=row[3],
        duration_seconds=float(row[4]), worker_id=row[5], failed_at=_time(row[6]),
    )


def _claimed(pair: tuple[sqlite3.Row, sqlite3.Row], subscription_id: int, token: str) -> ClaimedDelivery:
    d, e = pair
    return ClaimedDelivery(
        id=DeliveryId(d["id"]), event_id=EventId(d["event_id"]), subscription_id=subscription_id,
        attempts=d["attempts"], lease_token=token, event_type=e["event_type"],
        payload=bytes(e["payload"]), headers=_headers(e["headers"]), key=e["key"],
        correlation_id=e["correlation_id"], ordering_key=d["ordering_key"],
        created_at=_time(e["created_at"]),
    )


class _Waker:
    """In-process wake-ups: the same push/wait contract as PostgresListener."""

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


class _Link:
    """One sqlite3 connection, used by one thread call at a time."""

    def __init__(self, conn: sqlite3.Connection, deadline_seconds: float) -> None:
        self.conn = conn
        self.deadline_seconds = deadline_seconds
        self._lock = anyio.Lock()
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # Not cancellable once started: a transaction always runs to its end.
        async with self._lock:
            with translate_errors():
                return await anyio.to_thread.run_sync(fn, self.conn, limiter=self._limiter)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await anyio.to_thread.run_sync(self.conn.close, limiter=self._limiter)
