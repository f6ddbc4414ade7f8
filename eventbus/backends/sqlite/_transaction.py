"""The transaction of a transactional handler or state on SQLite: the writer link, held in BEGIN IMMEDIATE.

The handler gets the writer link's own aiosqlite connection inside a ``BEGIN
IMMEDIATE`` transaction; the bus's own write (a delivery's completion with
its follow-ups and starts, or a state machine's transition), guarded as
always, goes last on it, and one ``COMMIT`` ends both. While the handler runs
it holds the file's write lock: this process's other writes (claims,
results, lease renewals, heartbeats) wait on the link's lock in turn, and
other processes' writers wait on the file's lock for up to their lock
deadline (four times ``busy_timeout_ms``, at least 5 s). A handler's timeout
is therefore capped at half that deadline (:class:`ConfigurationError` beyond).

Transactional handlers of one process take their turn on a lock of their own
before they queue for the writer link, so at most one of them waits there:
a lease renewal or a claim waits for one handler at most, not for every
handler queued behind it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio

from ...errors import BackendError, ConfigurationError
from ..ports import Completion, LeaseKey
from . import _link
from ._db import SQLiteDb

__all__ = [
    "CompleteBody",
    "SQLiteHandlerTransaction",
    "SQLiteTransaction",
    "handler_transaction",
    "open_transaction",
]

T = TypeVar("T")

CompleteBody = Callable[
    [sqlite3.Connection, Any, float, Sequence[Completion]], tuple[set[LeaseKey], set[str]]
]
"""The body of a completion (``delivery.complete``): the leases applied and the event types to wake."""


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class SQLiteTransaction:
    """The writer link held in an open write transaction, ended by :meth:`finish` or rolled back."""

    def __init__(self, db: SQLiteDb, connection: Any, call: Callable[..., Awaitable[Any]]) -> None:
        self._db = db
        self._connection = connection
        self._call = call
        self.committed = False

    @property
    def connection(self) -> Any:
        return self._connection

    async def finish(
        self, write: Callable[[sqlite3.Connection, Any, float], tuple[T | None, set[str]]]
    ) -> T | None:
        """Run the bus's guarded ``write(conn, q, now)`` in the transaction; commit when it returns
        a value, roll everything back (and return None) when it returns None."""
        q = self._db.q

        def unit(conn: sqlite3.Connection) -> tuple[T | None, set[str]]:
            if not conn.in_transaction:
                raise BackendError("the transactional handler ended its transaction (COMMIT or ROLLBACK)")
            try:
                now: float = conn.execute(q["now"]).fetchone()[0]
                result, types = write(conn, q, now)
                conn.execute("ROLLBACK" if result is None else "COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            return result, types if result is not None else set()

        outcome: tuple[T | None, set[str]] = await self._call(unit)
        result, types = outcome
        self.committed = result is not None
        self._db.wake(types)
        return result


@contextlib.asynccontextmanager
async def open_transaction(db: SQLiteDb, timeout_seconds: float) -> AsyncIterator[SQLiteTransaction]:
    """The writer link in BEGIN IMMEDIATE for one handler run; rolled back unless ``finish`` committed it."""
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
            handle = SQLiteTransaction(db, link.db, call)
            yield handle
        finally:
            with anyio.CancelScope(shield=True):
                await call(_rollback)
    if handle.committed:
        await db.wrote()


class SQLiteHandlerTransaction:
    """A transactional handler's transaction (see ``HandlerTransaction``)."""

    def __init__(self, transaction: SQLiteTransaction, body: CompleteBody) -> None:
        self._transaction = transaction
        self._body = body

    @property
    def connection(self) -> Any:
        return self._transaction.connection

    async def commit(self, completion: Completion) -> bool:
        """Complete the delivery in the held transaction and commit; roll back when the lease is gone."""
        body = self._body

        def complete(conn: sqlite3.Connection, q: Any, now: float) -> tuple[bool | None, set[str]]:
            done, types = body(conn, q, now, [completion])
            return (True if completion.lease in done else None), types

        return bool(await self._transaction.finish(complete))


@contextlib.asynccontextmanager
async def handler_transaction(
    db: SQLiteDb, timeout_seconds: float, body: CompleteBody
) -> AsyncIterator[SQLiteHandlerTransaction]:
    """The transaction of one transactional handler run (see ``DeliveryStore.transaction``)."""
    async with open_transaction(db, timeout_seconds) as transaction:
        yield SQLiteHandlerTransaction(transaction, body)
