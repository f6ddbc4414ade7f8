"""The operator port on PostgreSQL: guarded admin writes by id and subscription moves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from ...errors import NotFound
from ._db import PgDb
from .ring import evict, to_queue

__all__ = ["PgOperator"]

AUDIT_TOP = 2**63 - 1
"""The keyset cursor of the first page: above every id."""


class PgOperator:
    """:class:`~eventbus.backends.ports.Operator` on PostgreSQL: each write is one guarded statement."""

    def __init__(self, db: PgDb) -> None:
        self.db = db
        self.q = db.q

    async def replay(self, ids: Sequence[int]) -> int:
        """Dead -> pending, attempts reset, waking the workers of the subscriptions touched."""
        async with self.db.tx("replay") as conn:
            rows = await conn.fetch(self.q["replay"], list(ids))
            subs = sorted({r["subscription_id"] for r in rows})
            if subs:
                await conn.execute(self.q["notify_subscriptions"], self.db.channel, subs)
        return len(rows)

    async def purge(self, ids: Sequence[int]) -> int:
        """Delete dead deliveries and their attempt history; returns how many."""
        async with self.db.conn("purge") as conn:
            return int(await conn.fetchval(self.q["purge"], list(ids)))

    async def cancel(
        self,
        ids: Sequence[int],
        audit: dict[str, Any] | None = None,
        lost_after_seconds: float | None = None,
    ) -> int:
        """Pending (and, given ``lost_after_seconds``, stuck) -> cancelled; returns how many moved."""
        async with self.db.tx("cancel") as conn:
            await to_queue(conn, self.db, ids)
            if lost_after_seconds is None:
                rows = await conn.fetch(self.q["cancel"], list(ids))
            else:
                rows = await conn.fetch(self.q["cancel_stuck"], list(ids), lost_after_seconds)
            await self._audit(conn, audit, len(rows))
        return len(rows)

    async def retry_now(self, ids: Sequence[int], audit: dict[str, Any] | None = None) -> int:
        """Waiting pending -> due now, waking the subscriptions' workers (see ``Operator.retry_now``)."""
        async with self.db.tx("retry now") as conn:
            row = await conn.fetchrow(self.q["retry_now"], list(ids), self.db.channel)
            moved = int(row["moved"])
            await self._audit(conn, audit, moved)
        return moved

    async def release_stuck(
        self,
        ids: Sequence[int],
        lost_after_seconds: float,
        message: str,
        audit: dict[str, Any] | None = None,
    ) -> int:
        """Stuck processing -> pending or dead, as a lease recovery (see ``Operator.release_stuck``)."""
        async with self.db.tx("release stuck") as conn:
            await to_queue(conn, self.db, ids)
            query = self.q["release_stuck"]
            row = await conn.fetchrow(query, list(ids), self.db.channel, lost_after_seconds, message)
            moved = int(row["released"])
            await self._audit(conn, audit, moved)
        return moved

    async def pause_subscription(self, name: str, audit: dict[str, Any] | None = None) -> bool:
        """Active -> paused (see ``Operator.pause_subscription``)."""
        async with self.db.tx("pause subscription") as conn:
            moved = await self._move(conn, name, "paused", ["active"]) is not None
            await self._audit(conn, audit, int(moved))
        return moved

    async def resume_subscription(self, name: str, audit: dict[str, Any] | None = None) -> bool:
        """Paused or removed -> active, waking workers for its backlog."""
        async with self.db.tx("resume subscription") as conn:
            row = await self._move(conn, name, "active", ["paused", "removed"])
            if row is not None:
                await conn.execute(self.q["notify_subscriptions"], self.db.channel, [row["id"]])
            await self._audit(conn, audit, int(row is not None))
        return row is not None

    async def remove_subscription(self, name: str, audit: dict[str, Any] | None = None) -> int:
        """Mark removed and cancel its pending deliveries (see ``Operator.remove_subscription``)."""
        async with self.db.tx("remove subscription") as conn:
            # Again on a removed one: a delivery that was running then may have come back to pending.
            row = await self._move(conn, name, "removed", ["active", "paused", "removed"])
            cancelled = 0
            if row is not None:
                await evict(conn, self.db, row["id"])  # its ring rows are cancelled as the rest
                result = await conn.execute(self.q["cancel_subscription"], row["id"])
                cancelled = int(result.split()[-1])
            await self._audit(conn, audit, cancelled)
        return cancelled

    async def _audit(self, conn: Any, audit: dict[str, Any] | None, count: int) -> None:
        """The action's audit row, in its transaction (nothing without one)."""
        if audit is not None:
            await conn.execute(self.q["audit_record"], *_audit_args({**audit, "count": count}))

    async def record_audit(self, entry: dict[str, Any]) -> int:
        """One audit row (see ``Operator.record_audit``)."""
        async with self.db.conn("record audit") as conn:
            return int(await conn.fetchval(self.q["audit_record"], *_audit_args(entry)))

    async def audit_entries(
        self, *, limit: int, action: str | None = None, actor: str | None = None, before: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit rows newest first through the index of the filter given (see ``Operator.audit_entries``)."""
        cursor = AUDIT_TOP if before is None else before
        args: tuple[Any, ...]
        if action is not None and actor is not None:
            query, args = self.q["audit_page_actor_action"], (cursor, limit, action, actor)
        elif action is not None:
            query, args = self.q["audit_page_action"], (cursor, limit, action)
        elif actor is not None:
            query, args = self.q["audit_page_actor"], (cursor, limit, actor)
        else:
            query, args = self.q["audit_page"], (cursor, limit)
        async with self.db.conn("audit entries") as conn:
            return [dict(r) for r in await conn.fetch(query, *args)]

    async def _move(self, conn: Any, name: str, state: str, from_states: list[str]) -> asyncpg.Record | None:
        """One guarded state change; :class:`NotFound` when no subscription has the name."""
        query = self.q["subscription_state"]
        row: asyncpg.Record | None = await conn.fetchrow(query, name, state, from_states)
        if row is None and await conn.fetchval(self.q["subscription_exists"], name) is None:
            raise NotFound(f"no subscription named {name!r}")
        return row


def _audit_args(e: dict[str, Any]) -> tuple[Any, ...]:
    """The parameters of ``audit_record`` from an audit row."""
    return (e["actor"], e["origin"], e["action"], e["target"], e["filter"], e["count"], e["interface"])
