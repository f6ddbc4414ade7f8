"""The :class:`~eventbus.backends.base.Operator` port on SQLite: guarded admin writes.

Each is one write transaction whose statements touch only rows still in the
expected state (a replay only dead rows, a cancel only pending ones).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import NotFound
from ._db import SQLiteDb
from ._link import Queries
from ._units import event_types_of, ids_json, rows, to_time

__all__ = ["SQLiteOperator"]

AUDIT_TOP = 2**63 - 1
"""The keyset cursor of the first page: above every id."""


class SQLiteOperator:
    """Replay, purge and cancel by id; pause, resume and remove subscriptions."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def replay(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        moved, types = await self._db.write(replay, ids)
        self._db.wake(types)
        return moved

    async def purge(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        return await self._db.write(purge, ids)

    async def cancel(
        self,
        ids: Sequence[int],
        audit: dict[str, Any] | None = None,
        lost_after_seconds: float | None = None,
    ) -> int:
        if not ids and audit is None:
            return 0
        return await self._db.write(cancel, ids, audit, lost_after_seconds)

    async def retry_now(self, ids: Sequence[int], audit: dict[str, Any] | None = None) -> int:
        if not ids and audit is None:
            return 0
        moved, types = await self._db.write(retry_now, ids, audit)
        self._db.wake(types)  # other processes see the commit (data_version)
        return moved

    async def release_stuck(
        self,
        ids: Sequence[int],
        lost_after_seconds: float,
        message: str,
        audit: dict[str, Any] | None = None,
    ) -> int:
        if not ids and audit is None:
            return 0
        moved, types = await self._db.write(release_stuck, ids, lost_after_seconds, message, audit)
        self._db.wake(types)
        return moved

    async def pause_subscription(self, name: str, audit: dict[str, Any] | None = None) -> bool:
        return await self._db.write(move_audited, name, "paused", ("active",), audit) is not None

    async def resume_subscription(self, name: str, audit: dict[str, Any] | None = None) -> bool:
        moved = await self._db.write(move_audited, name, "active", ("paused", "removed"), audit)
        if moved is not None:
            self._db.wake({moved[1]})
        return moved is not None

    async def remove_subscription(self, name: str, audit: dict[str, Any] | None = None) -> int:
        return await self._db.write(remove_subscription, name, audit)

    async def record_audit(self, entry: dict[str, Any]) -> int:
        return await self._db.write(record_audit, entry)

    async def audit_entries(
        self, *, limit: int, action: str | None = None, actor: str | None = None, before: int | None = None
    ) -> list[dict[str, Any]]:
        params = {"limit": limit, "action": action, "actor": actor, "before": before or AUDIT_TOP}
        by_actor = actor is not None
        found = await self._db.fetch(
            ("audit_page_actor_action" if by_actor else "audit_page_action")
            if action is not None
            else ("audit_page_actor" if by_actor else "audit_page"),
            params,
        )  # one query per filter shape, each planned on its own index
        return [{**dict(r), "at": to_time(r["at"])} for r in found]


# -- units of work (on the writer's thread, under the write lock) ---------------------


def replay(conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int]) -> tuple[int, set[str]]:
    """Dead -> pending for ``ids``; how many moved and the event types to wake."""
    moved = rows(conn, q["replay"], {"ids": ids_json(ids), "now": now})
    return len(moved), event_types_of(conn, q, {int(r[0]) for r in moved})


def purge(conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int]) -> int:
    """Delete the dead deliveries among ``ids`` and their attempt history."""
    gone = [int(r[0]) for r in rows(conn, q["purge"], {"ids": ids_json(ids), "now": now})]
    if gone:
        conn.execute(q["purge_history"], {"ids": ids_json(gone)})
    return len(gone)


def cancel(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    ids: Sequence[int],
    audit: dict[str, Any] | None,
    lost_after_seconds: float | None = None,
) -> int:
    """Pending (and, given ``lost_after_seconds``, stuck) -> cancelled among ``ids``, with the audit row."""
    params = {"ids": ids_json(ids), "now": now, "lost_after": lost_after_seconds}
    moved = len(rows(conn, q["cancel" if lost_after_seconds is None else "cancel_stuck"], params))
    _audit(conn, q, now, audit, moved)
    return moved


def retry_now(
    conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int], audit: dict[str, Any] | None
) -> tuple[int, set[str]]:
    """Waiting pending -> due now among ``ids``; how many moved and the event types to wake."""
    moved = rows(conn, q["retry_now"], {"ids": ids_json(ids), "now": now})
    _audit(conn, q, now, audit, len(moved))
    return len(moved), event_types_of(conn, q, {int(r[0]) for r in moved})


def release_stuck(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    ids: Sequence[int],
    lost_after_seconds: float,
    message: str,
    audit: dict[str, Any] | None,
) -> tuple[int, set[str]]:
    """Stuck processing -> pending or dead among ``ids``, the attempt recorded as ``Released``."""
    params = {"ids": ids_json(ids), "now": now, "lost_after": lost_after_seconds, "message": message}
    moved = rows(conn, q["release_stuck"], params)
    conn.executemany(q["release_record"], [
        {"delivery_id": r["id"], "attempt": r["attempts"], "worker_id": r["worker_id"],
         "message": message, "now": now}
        for r in moved
    ])  # fmt: skip
    _audit(conn, q, now, audit, len(moved))
    woken = {int(r["subscription_id"]) for r in moved if r["status"] == "pending"}
    return len(moved), event_types_of(conn, q, woken)


def _audit(
    conn: sqlite3.Connection, q: Queries, now: float, audit: dict[str, Any] | None, count: int
) -> None:
    """The action's audit row with its count, in its transaction (nothing without one)."""
    if audit is not None:
        record_audit(conn, q, now, {**audit, "count": count})


def move_audited(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    name: str,
    state: str,
    from_states: Sequence[str],
    audit: dict[str, Any] | None,
) -> tuple[int, str] | None:
    """:func:`move_subscription` with the action's audit row (count 1 or 0) when given."""
    moved = move_subscription(conn, q, now, name, state, from_states)
    if audit is not None:
        record_audit(conn, q, now, {**audit, "count": int(moved is not None)})
    return moved


def move_subscription(
    conn: sqlite3.Connection, q: Queries, now: float, name: str, state: str, from_states: Sequence[str]
) -> tuple[int, str] | None:
    """One guarded state change: (id, event type) when it moved; :class:`NotFound` if no such name."""
    params = {"name": name, "state": state, "from_states": orjson.dumps(list(from_states)).decode()}
    moved = rows(conn, q["subscription_state"], params)
    if moved:
        return int(moved[0][0]), str(moved[0][1])
    if not rows(conn, q["subscription_exists"], {"name": name}):
        raise NotFound(f"no subscription named {name!r}")
    return None


def remove_subscription(
    conn: sqlite3.Connection, q: Queries, now: float, name: str, audit: dict[str, Any] | None
) -> int:
    """Mark removed and cancel its pending deliveries, in one transaction (with its audit row)."""
    # Again on a removed one: a delivery that was running then may have come back to pending.
    moved = move_subscription(conn, q, now, name, "removed", ("active", "paused", "removed"))
    cancelled = 0
    if moved is not None:
        params = {"subscription_id": moved[0], "now": now}
        cancelled = conn.execute(q["cancel_subscription"], params).rowcount
    if audit is not None:
        record_audit(conn, q, now, {**audit, "count": cancelled})
    return cancelled


def record_audit(conn: sqlite3.Connection, q: Queries, now: float, entry: dict[str, Any]) -> int:
    """One audit row at the writer's clock."""
    return int(conn.execute(q["audit_record"], {**entry, "now": now}).fetchone()[0])
