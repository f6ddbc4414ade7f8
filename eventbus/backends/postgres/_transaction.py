"""The transaction of a transactional handler or state on PostgreSQL: one pooled connection.

The handler writes through the connection; the bus's own write (a
delivery's completion with its follow-ups and starts, or a state machine's
transition) goes last on the same connection, guarded as always (by lease
token, and by version for a transition), and commits with it. Nothing of the
bus is locked before that write, so lease renewals and other workers' lease
recoveries never wait for a handler: a recovery that wins makes the guarded
write match nothing, and the transaction rolls back whole.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from ..ports import Completion
from ._db import PgDb, translate_errors

if TYPE_CHECKING:
    from .delivery import PgDeliveries

__all__ = ["PgHandlerTransaction", "PgTransaction", "handler_transaction", "open_transaction"]

T = TypeVar("T")

_ROLLBACK_SECONDS = 5.0
"""How long a rollback may take before the connection is given up (the pool then closes it)."""


class PgTransaction:
    """One open transaction on a pooled connection, ended by :meth:`finish` or rolled back."""

    def __init__(self, db: PgDb, conn: Any, transaction: Any) -> None:
        self._db = db
        self._conn = conn
        self._transaction = transaction
        self.done = False
        """Committed or rolled back: nothing is left to undo."""

    @property
    def connection(self) -> Any:
        return self._conn

    async def finish(self, write: Callable[[Any], Awaitable[T | None]], operation: str) -> T | None:
        """Run the bus's guarded ``write`` on the connection; commit when it returns a value,
        roll everything back (and return None) when it returns None."""
        with translate_errors(operation, self._db.command_timeout):
            result = await write(self._conn)
            self.done = True
            if result is None:
                await self._transaction.rollback()
                return None
            await self._transaction.commit()
        return result


def _idle_limit(db_seconds: float | None, timeout_seconds: float) -> str | None:
    """The idle-in-transaction limit a handler of ``timeout_seconds`` needs, when above the session's."""
    if db_seconds is None or not math.isfinite(timeout_seconds) or timeout_seconds < db_seconds:
        return None
    return f"{int(timeout_seconds + db_seconds) * 1000}ms"


@contextlib.asynccontextmanager
async def open_transaction(db: PgDb, timeout_seconds: float) -> AsyncIterator[PgTransaction]:
    """A pooled connection inside a transaction; rolled back unless :meth:`PgTransaction.finish` ended it.

    At most ``max_pool_size`` - 2 are open at once in a process (``PgDb.handler_slots``), so
    that a queue of handlers never keeps the worker's lease renewals and claims from a
    connection. The session's dead-client guard ends a transaction idle for
    ``dead_client_seconds``; a handler allowed to run longer than that raises it for its
    own transaction (one ``set_config`` more).
    """
    async with db.handler_slots, db.conn("a transactional handler") as conn:
        transaction = conn.transaction()
        with translate_errors("a transactional handler", db.command_timeout):
            await transaction.start()
        handle = PgTransaction(db, conn, transaction)
        try:
            limit = _idle_limit(db.dead_client_seconds, timeout_seconds)
            if limit is not None:
                await db.allow_idle(conn, limit)
            yield handle
        finally:
            if not handle.done:
                # shielded, so a stop cannot leave it open; bounded, so a silent server cannot hold the stop
                with anyio.move_on_after(_ROLLBACK_SECONDS, shield=True), contextlib.suppress(Exception):
                    await transaction.rollback()


class PgHandlerTransaction:
    """A transactional handler's transaction (see ``HandlerTransaction``)."""

    def __init__(self, deliveries: PgDeliveries, transaction: PgTransaction) -> None:
        self._deliveries = deliveries
        self._transaction = transaction

    @property
    def connection(self) -> Any:
        return self._transaction.connection

    async def commit(self, completion: Completion) -> bool:
        """Complete the delivery on this connection and commit; roll back when the lease is gone."""

        async def complete(conn: Any) -> bool | None:
            applied = await self._deliveries.complete_on(conn, [completion])
            return True if completion.lease in applied else None

        return bool(await self._transaction.finish(complete, "a transactional completion"))


@contextlib.asynccontextmanager
async def handler_transaction(
    deliveries: PgDeliveries, timeout_seconds: float
) -> AsyncIterator[PgHandlerTransaction]:
    """The transaction of one transactional handler run (see ``DeliveryStore.transaction``)."""
    async with open_transaction(deliveries.db, timeout_seconds) as transaction:
        yield PgHandlerTransaction(deliveries, transaction)
