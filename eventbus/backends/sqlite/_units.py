"""What the units of work of several SQLite ports share: publishing, wake-up types, times.

A unit of work is the body of one transaction: it takes the connection, the
queries and ``now`` (the database clock at BEGIN IMMEDIATE), and runs on the
writer's thread through :func:`._link.write`, so nothing is awaited while the
write lock is held. Publishing is here because deliveries, schedule ticks and
workflow transitions all publish inside their own transactions. Times are
stored as REAL epoch seconds and returned as aware UTC datetimes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from ...errors import PublishError
from ...types import EventId, PublishResult
from ..base import OutgoingEvent
from ._link import Queries

__all__ = ["event_types_of", "ids_json", "publish", "rows", "to_epoch", "to_time"]

Row = sqlite3.Row


def rows(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[Row]:
    """Every row of one statement (always drained: a RETURNING statement must finish before COMMIT)."""
    return conn.execute(sql, params).fetchall()


def ids_json(ids: Sequence[int]) -> str:
    """Ids as the JSON array the queries open with ``json_each``."""
    return orjson.dumps([int(i) for i in ids]).decode()


def to_time(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC)


def to_epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def publish(
    conn: sqlite3.Connection, q: Queries, now: float, events: Sequence[OutgoingEvent]
) -> tuple[list[PublishResult], set[str]]:
    """Insert events (skipping taken keys) and fan out; return results and new types."""
    subscribers = _subscribers(conn, q, events)
    results: list[PublishResult] = []
    fanout: list[dict[str, Any]] = []
    inserted: set[str] = set()
    for e in events:
        kept = _kept_id(conn, q, e) if e.keep_key else None
        if kept is not None:
            results.append(PublishResult(kept, duplicate=True))
            continue
        found = rows(conn, q["publish"], _event_params(e, now))
        if not found:
            results.append(_keep(conn, q, now, e, PublishResult(_existing_id(conn, q, e), duplicate=True)))
            continue
        event_id, deliver_at = int(found[0][0]), float(found[0][1])
        results.append(_keep(conn, q, now, e, PublishResult(EventId(event_id), duplicate=False)))
        inserted.add(e.event_type)
        fanout.extend(
            {
                "event_id": event_id,
                "subscription_id": sub_id,
                "run_at": deliver_at,
                "now": now,
                "ordering_key": e.ordering_key if ordered else None,
                "priority": e.priority,
            }
            for sub_id, ordered in subscribers.get(e.event_type, ())
        )
    if fanout:
        conn.executemany(q["fanout"], fanout)
    return results, inserted


def _kept_id(conn: sqlite3.Connection, q: Queries, e: OutgoingEvent) -> EventId | None:
    """The event that took ``e``'s key for good, if one did."""
    found = rows(conn, q["kept_key"], {"event_type": e.event_type, "key": e.key})
    return EventId(int(found[0][0])) if found else None


def _keep(
    conn: sqlite3.Connection, q: Queries, now: float, e: OutgoingEvent, result: PublishResult
) -> PublishResult:
    """Keep ``e``'s key for good (``once=True``) with the event that holds it; return ``result``."""
    if e.keep_key:
        params = {"event_type": e.event_type, "key": e.key, "event_id": result.event_id, "now": now}
        conn.execute(q["keep_key"], params)
    return result


def _subscribers(
    conn: sqlite3.Connection, q: Queries, events: Sequence[OutgoingEvent]
) -> dict[str, list[tuple[int, bool]]]:
    """(subscription id, ordered) of every subscription of the batch's event types, by type."""
    types = orjson.dumps(sorted({e.event_type for e in events})).decode()
    subscribers: dict[str, list[tuple[int, bool]]] = {}
    for r in rows(conn, q["subscribers"], {"event_types": types}):
        subscribers.setdefault(r[0], []).append((int(r[1]), bool(r[2])))
    return subscribers


def _event_params(e: OutgoingEvent, now: float) -> dict[str, Any]:
    return {
        "event_type": e.event_type,
        "key": e.key,
        "payload": e.payload,
        "headers": e.headers_json,
        "correlation_id": e.correlation_id,
        "causation_id": e.causation_id,
        "ordering_key": e.ordering_key,
        "delay_seconds": e.delay_seconds,
        "version": e.event_version,
        "priority": e.priority,
        "now": now,
    }


def _existing_id(conn: sqlite3.Connection, q: Queries, e: OutgoingEvent) -> EventId:
    found = rows(conn, q["existing_id"], {"event_type": e.event_type, "key": e.key})
    if not found:
        raise PublishError(f"event {e.event_type}/{e.key} conflicted with a row it cannot see")
    return EventId(int(found[0][0]))


def event_types_of(conn: sqlite3.Connection, q: Queries, subscription_ids: set[int]) -> set[str]:
    """The event types of some subscriptions: whom a move back to pending wakes."""
    found = rows(conn, q["subscription_types"], {"ids": ids_json(sorted(subscription_ids))})
    return {str(r[0]) for r in found}
