"""A transactional handler's transaction on SQLite: the writer link, held in BEGIN IMMEDIATE.

The handler gets the writer link's own aiosqlite connection inside a ``BEGIN
IMMEDIATE`` transaction; the completion (fenced by lease token, with its
follow-ups and starts) is written last on it, and one ``COMMIT`` ends both.
While the handler runs it holds the file's write lock: this process's other
writes (claims, results, lease renewals, heartbeats) wait on the link's lock
in turn, and other processes' writers wait on the file's lock for up to their
lock deadline (four times ``busy_timeout_ms``, at least 5 s). A handler's timeout is
therefore capped at half that deadline (:class:`ConfigurationError` beyond).

Transactional handlers of one process take their turn on a lock of their own
before they queue for the writer link, so at most one of them waits there:
a lease renewal or a claim waits for one handler at most, not for every
handler queued behind it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio

from ...errors import BackendError, ConfigurationError
from ..ports import Completion, LeaseKey
from . import _link
from ._db import SQLiteDb

__all__ = ["CompleteBody", "SQLiteHandlerTransaction", "handler_transaction"]

CompleteBody = Callable[
    [sqlite3.Connection, Any, float, Sequence[Completion]], tuple[set[LeaseKey], set[str]]
]
"""The body of a completion (``delivery.complete``): the leases applied and the event types to wake."""


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class SQLiteHandlerTransaction:
    """The open transaction of one handler run (see ``HandlerTransaction``)."""

    def __init__(
        self, db: SQLiteDb, connection: Any, call: Callable[..., Awaitable[Any]], body: CompleteBody
    ) -> None:
        self._db = db
        self._connection = connection
        self._call = call
        self._body = body
        self.committed = False

    @property
    def connection(self) -> Any:
        return self._connection

    async def commit(self, completion: Completion) -> bool:
        """Complete the delivery in the held transaction and commit; roll back when the lease is gone."""
        q, body = self._db.q, self._body

        def unit(conn: sqlite3.Connection) -> tuple[bool, set[str]]:
            if not conn.in_transaction:
                raise BackendError(
                    "the transactional handler ended its transaction itself (COMMIT or ROLLBACK)"
                )
            try:
                now: float = conn.execute(q["now"]).fetchone()[0]
                done, types = body(conn, q, now, [completion])
                if completion.lease not in done:
                    conn.execute("ROLLBACK")
                    return False, set()
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            return True, types

        applied, types = await self._call(unit)
        self.committed = applied
        self._db.wake(types)
        return bool(applied)


@contextlib.asynccontextmanager
async def handler_transaction(
    db: SQLiteDb, timeout_seconds: float, body: CompleteBody
) -> AsyncIterator[SQLiteHandlerTransaction]:
    """The writer link in BEGIN IMMEDIATE for one handler run; rolled back unless its completion committed."""
    cap = db.options.lock_deadline_seconds / 2
    if not timeout_seconds <= cap:
        raise ConfigurationError(
            f"a transactional handler on SQLite holds the file's write lock while it runs: its timeout "
            f"must be at most {cap:g}s (half the lock deadline of other writers, busy_timeout_ms x 4), "
            f"got {timeout_seconds}"
        )
    async with db.handler_turn, db.held_writer() as (link, call):
        deadline = link.deadline_seconds
        try:
            await call(lambda conn: _link.begin(conn, deadline))
            handle = SQLiteHandlerTransaction(db, link.db, call, body)
            yield handle
        finally:
            with anyio.CancelScope(shield=True):
                await call(_rollback)
    if handle.committed:
        await db.wrote()
