"""A transactional handler's transaction on PostgreSQL: one pooled connection, one transaction.

The handler writes through the connection; the completion (the fenced
``UPDATE … WHERE lease_token = $token``, the follow-ups, the starts) is
written last on the same connection and commits with it. The delivery's row
is not touched before the commit, so lease renewals and other workers' lease
recoveries never wait for a handler: a recovery that wins makes the fenced
update match nothing, and the transaction rolls back whole.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio

from ..ports import Completion
from ._db import translate_errors

if TYPE_CHECKING:
    from .delivery import PgDeliveries

__all__ = ["PgHandlerTransaction", "handler_transaction"]

_ROLLBACK_SECONDS = 5.0
"""How long a rollback may take before the connection is given up (the pool then closes it)."""


class PgHandlerTransaction:
    """The open transaction of one handler run (see ``HandlerTransaction``)."""

    def __init__(self, deliveries: PgDeliveries, conn: Any, transaction: Any) -> None:
        self._deliveries = deliveries
        self._conn = conn
        self._transaction = transaction
        self.done = False
        """Committed or rolled back: nothing is left to undo."""

    @property
    def connection(self) -> Any:
        return self._conn

    async def commit(self, completion: Completion) -> bool:
        """Complete the delivery on this connection and commit; roll back when the lease is gone."""
        db = self._deliveries.db
        with translate_errors("a transactional completion", db.command_timeout):
            applied = await self._deliveries.complete_on(self._conn, [completion])
            self.done = True
            if completion.lease not in applied:
                await self._transaction.rollback()
                return False
            await self._transaction.commit()
        return True


def _idle_limit(db_seconds: float | None, timeout_seconds: float) -> str | None:
    """The idle-in-transaction limit a handler of ``timeout_seconds`` needs, when above the session's."""
    if db_seconds is None or not math.isfinite(timeout_seconds) or timeout_seconds < db_seconds:
        return None
    return f"{int(timeout_seconds + db_seconds) * 1000}ms"


@contextlib.asynccontextmanager
async def handler_transaction(
    deliveries: PgDeliveries, timeout_seconds: float
) -> AsyncIterator[PgHandlerTransaction]:
    """A pooled connection inside a transaction; rolled back unless the handler's completion committed it.

    At most ``max_pool_size`` - 2 run at once in a process (``PgDb.handler_slots``), so that a
    queue of handlers never keeps the worker's lease renewals and claims from a connection.

    The session's dead-client guard ends a transaction idle for
    ``dead_client_seconds``; a handler allowed to run longer than that raises
    it for its own transaction (one ``set_config`` more).
    """
    db = deliveries.db
    async with db.handler_slots, db.conn("a transactional handler") as conn:
        transaction = conn.transaction()
        with translate_errors("a transactional handler", db.command_timeout):
            await transaction.start()
        handle = PgHandlerTransaction(deliveries, conn, transaction)
        try:
            limit = _idle_limit(db.dead_client_seconds, timeout_seconds)
            if limit is not None:
                await deliveries.allow_idle(conn, limit)
            yield handle
        finally:
            if not handle.done:
                # shielded, so a stop cannot leave it open; bounded, so a silent server cannot hold the stop
                with anyio.move_on_after(_ROLLBACK_SECONDS, shield=True), contextlib.suppress(Exception):
                    await transaction.rollback()
