"""The synchronous half of the SQLite backend.

Each function here is one whole unit of work on a :class:`sqlite3.Connection`
and runs on that connection's worker thread, so nothing is awaited while a
write transaction is open. Writes go through :func:`write`: ``BEGIN
IMMEDIATE`` (take the write lock before reading anything, so two writers can
never deadlock upgrading a read lock), one time stamp from the database clock,
the body, ``COMMIT``. A busy database is retried with backoff until a
deadline; "database is locked" never reaches a caller.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from .. import migrate as migrations
from ..errors import BackendUnavailable, PublishError, RegistrationError
from .base import (
    Completion,
    DeadLetterFilter,
    DeliveryId,
    EventId,
    Failure,
    OutgoingEvent,
    PublishResult,
    SubscriptionSpec,
)

__all__ = ["Queries", "is_busy", "read", "write"]

log = logging.getLogger("eventbus.sqlite")

T = TypeVar("T")
Queries = dict[str, str]
Row = sqlite3.Row

_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary result codes)
_SYNCHRONOUS = {
    "FULL": "PRAGMA synchronous = FULL",
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "EXTRA": "PRAGMA synchronous = EXTRA",
}


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` means another connection holds a lock we need."""
    return isinstance(exc, sqlite3.OperationalError) and (
        getattr(exc, "sqlite_errorcode", 0) & 0xFF in _BUSY_CODES
        or "database is locked" in str(exc)
    )


# -- connections --------------------------------------------------------------


def connect(path: str, synchronous: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open one connection in autocommit mode: transactions are explicit."""
    conn = sqlite3.connect(
        path, timeout=busy_timeout_ms / 1000, isolation_level=None,
        check_same_thread=False, cached_statements=256,
    )
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(_SYNCHRONOUS[synchronous])
        # After a checkpoint resets the WAL, truncate the file back to 64 MiB.
        conn.execute("PRAGMA journal_size_limit = 67108864")
    except BaseException:
        conn.close()
        raise
    return conn


def enable_wal(conn: sqlite3.Connection) -> str:
    """Switch the file to WAL (persistent): readers never block the writer."""
    mode: str = read(conn, lambda c: c.execute("PRAGMA journal_mode = WAL").fetchone()[0], 30.0)
    if mode.lower() != "wal":
        log.warning("SQLite refused WAL mode (%s); concurrent access will be slower", mode)
    return mode


def checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """Copy the WAL into the database and truncate it, if no reader is in the way."""
    row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return (int(row[0]), int(row[1]), int(row[2]))


def _backoff(attempt: int) -> float:
    return random.uniform(0.5, 1.0) * min(0.25, 0.005 * 2.0**attempt)


def _retry_busy(body: Callable[[], T], deadline_seconds: float) -> T:
    deadline = time.monotonic() + deadline_seconds
    attempt = 0
    while True:
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


def read(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T],
         deadline_seconds: float) -> T:
    """Run a read (autocommit statements), retrying while the file is busy."""
    return _retry_busy(lambda: body(conn), deadline_seconds)


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
            now: float = conn.execute(q["now"]).fetchone()[0]
            result = body(conn, now)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    return _retry_busy(once, deadline_seconds)


def _all(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[Row]:
    # Always drain: a RETURNING statement must run to completion before COMMIT.
    return conn.execute(sql, params).fetchall()


def _ids_json(ids: Sequence[int]) -> str:
    return orjson.dumps([int(i) for i in ids]).decode()


# -- migrations ------------------------------------------------------------------


def _statements(sql: str) -> list[str]:
    """Split a migration file into statements, as the sqlite3 shell does."""
    statements, buffer = [], ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer)
            buffer = ""
    return statements


def applied_migrations(conn: sqlite3.Connection, q: Queries) -> dict[int, str] | None:
    """Applied versions and checksums, or None before the first migration."""
    try:
        rows = _all(conn, q["migrations_applied"])
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return {int(r[0]): str(r[1]) for r in rows}


def apply_next_migration(conn: sqlite3.Connection, q: Queries, now: float) -> str | None:
    """Apply the first pending migration (under the write lock); None when done."""
    conn.execute(q["migrations_table"])
    applied = applied_migrations(conn, q) or {}
    todo = migrations.pending(migrations.discover("sqlite"), applied)
    if not todo:
        return None
    m = todo[0]
    for statement in _statements(m.sql):
        conn.execute(statement)
    conn.execute(q["migration_record"], {
        "version": m.version, "name": m.name, "checksum": m.checksum, "now": now,
    })
    return m.name


# -- publish and register -----------------------------------------------------------


def publish(
    conn: sqlite3.Connection, q: Queries, now: float, events: Sequence[OutgoingEvent]
) -> tuple[list[PublishResult], set[str]]:
    """Insert events (skipping taken keys) and fan out; return results and new types."""
    types = sorted({e.event_type for e in events})
    subscribers: dict[str, list[tuple[int, bool]]] = {}
    for r in _all(conn, q["subscribers"], {"event_types": orjson.dumps(types).decode()}):
        subscribers.setdefault(r[0], []).append((int(r[1]), bool(r[2])))
    results: list[PublishResult] = []
    fanout: list[dict[str, Any]] = []
    inserted: set[str] = set()
    for e in events:
        rows = _all(conn, q["publish"], _event_params(e, now))
        if not rows:
            results.append(PublishResult(_existing_id(conn, q, e), duplicate=True))
            continue
        event_id, deliver_at = int(rows[0][0]), float(rows[0][1])
        results.append(PublishResult(EventId(event_id), duplicate=False))
        inserted.add(e.event_type)
        fanout.extend(
            {"event_id": event_id, "subscription_id": sub_id, "run_at": deliver_at, "now": now,
             "ordering_key": e.ordering_key if ordered else None}
            for sub_id, ordered in subscribers.get(e.event_type, ())
        )
    if fanout:
        conn.executemany(q["fanout"], fanout)
    return results, inserted


def _event_params(e: OutgoingEvent, now: float) -> dict[str, Any]:
    return {
        "event_type": e.event_type, "key": e.key, "payload": e.payload,
        "headers": orjson.dumps(e.headers).decode() if e.headers else "{}",
        "correlation_id": e.correlation_id, "causation_id": e.causation_id,
        "ordering_key": e.ordering_key, "delay_seconds": e.delay_seconds, "now": now,
    }


def _existing_id(conn: sqlite3.Connection, q: Queries, e: OutgoingEvent) -> EventId:
    rows = _all(conn, q["existing_id"], {"event_type": e.event_type, "key": e.key})
    if not rows:
        raise PublishError(f"event {e.event_type}/{e.key} conflicted with a row it cannot see")
    return EventId(int(rows[0][0]))


def register(
    conn: sqlite3.Connection, q: Queries, now: float, specs: Sequence[SubscriptionSpec]
) -> dict[str, int]:
    """Upsert subscriptions by name; backfill new ones that start from the earliest event."""
    ids: dict[str, int] = {}
    for spec in specs:
        params: dict[str, Any] = {
            "name": spec.name, "event_type": spec.event_type, "max_attempts": spec.max_attempts,
            "lease_seconds": spec.lease_seconds, "ordered": int(spec.ordered), "now": now,
        }
        found = _all(conn, q["subscription_by_name"], {"name": spec.name})
        if found and found[0][1] != spec.event_type:
            raise RegistrationError(
                f"subscription {spec.name!r} is already bound to another event type; "
                "pick a new name for a new event type"
            )
        if found:
            ids[spec.name] = int(found[0][0])
            conn.execute(q["subscription_update"], {**params, "id": ids[spec.name]})
            continue
        ids[spec.name] = int(_all(conn, q["subscription_insert"], params)[0][0])
        if spec.start_from == "earliest":
            backfill(conn, q, now, ids[spec.name], spec)
    return ids


def backfill(
    conn: sqlite3.Connection, q: Queries, now: float, subscription_id: int,
    spec: SubscriptionSpec,
) -> None:
    conn.execute(q["backfill"], {
        "subscription_id": subscription_id, "event_type": spec.event_type,
        "ordered": int(spec.ordered), "now": now,
    })


# -- the delivery state machine -------------------------------------------------------


def has_rows(conn: sqlite3.Connection, sql: str, params: Any = ()) -> bool:
    """An autocommit probe, run before taking the write lock."""
    return conn.execute(sql, params).fetchone() is not None


def claim(
    conn: sqlite3.Connection, q: Queries, now: float, params: dict[str, Any], ordered: bool
) -> list[tuple[Row, Row]]:
    """Lease runnable deliveries; return (delivery, event) row pairs in run order."""
    params = {**params, "now": now}
    try:
        taken = _all(conn, q["claim_ordered" if ordered else "claim"], params)
    except sqlite3.IntegrityError:
        # deliveries_one_per_key: cannot happen under the write lock, but the
        # index is the rule, so a violation means "nothing claimable now".
        return []
    if not taken:
        return []
    taken.sort(key=lambda r: (r["run_at"], r["id"]))
    events = {
        int(r["id"]): r
        for r in _all(conn, q["claimed_events"], {"event_ids": _ids_json([r["event_id"] for r in taken])})
    }
    return [(r, events[int(r["event_id"])]) for r in taken]


def complete(
    conn: sqlite3.Connection, q: Queries, now: float, completions: Sequence[Completion]
) -> tuple[set[DeliveryId], list[PublishResult], set[str]]:
    """Complete owned deliveries and publish their follow-ups in the same transaction."""
    done: set[DeliveryId] = set()
    for c in completions:
        params = {"id": c.delivery_id, "lease_token": c.lease_token, "now": now}
        if _all(conn, q["complete"], params):
            done.add(c.delivery_id)
    follow_ups = [e for c in completions if c.delivery_id in done for e in c.follow_ups]
    if not follow_ups:
        return done, [], set()
    results, types = publish(conn, q, now, follow_ups)
    return done, results, types


def fail(
    conn: sqlite3.Connection, q: Queries, now: float, failures: Sequence[Failure]
) -> set[DeliveryId]:
    """Retry or bury owned deliveries, appending each attempt to the history."""
    failed: set[DeliveryId] = set()
    for f in failures:
        rows = _all(conn, q["fail"], {
            "id": f.delivery_id, "lease_token": f.lease_token, "dead": int(f.dead),
            "delay_seconds": f.retry_delay_seconds, "error_type": f.error_type,
            "message": f.message, "now": now,
        })
        if not rows:
            continue
        failed.add(f.delivery_id)
        conn.execute(q["attempt_record"], {
            "delivery_id": f.delivery_id, "attempt": rows[0]["attempts"],
            "error_type": f.error_type, "message": f.message, "traceback": f.traceback,
            "duration_seconds": f.duration_seconds, "worker_id": f.worker_id, "now": now,
        })
    return failed


def release(
    conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int], lease_token: str
) -> int:
    cursor = conn.execute(q["release"], {
        "ids": _ids_json(ids), "lease_token": lease_token, "now": now,
    })
    return cursor.rowcount


def extend(
    conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int], lease_token: str,
    lease_seconds: float,
) -> set[DeliveryId]:
    rows = _all(conn, q["extend"], {
        "ids": _ids_json(ids), "lease_token": lease_token, "lease_seconds": lease_seconds,
        "now": now,
    })
    return {DeliveryId(int(r[0])) for r in rows}


def recover_expired(conn: sqlite3.Connection, q: Queries, now: float, limit: int) -> int:
    """Expired leases: the attempt counts; back to pending, or dead when out of attempts."""
    rows = _all(conn, q["recover_expired"], {"limit": limit, "now": now})
    conn.executemany(q["recover_record"], [
        {"delivery_id": r["id"], "attempt": r["attempts"], "worker_id": r["worker_id"],
         "now": now}
        for r in rows
    ])
    return len(rows)


def worker_beat(
    conn: sqlite3.Connection, q: Queries, now: float, params: dict[str, Any] | None,
    worker_id: str,
) -> None:
    if params is None:
        conn.execute(q["worker_gone"], {"id": worker_id, "now": now})
    else:
        conn.execute(q["worker_beat"], {**params, "id": worker_id, "now": now})


# -- operations --------------------------------------------------------------------


def filter_params(flt: DeadLetterFilter, since: float | None) -> dict[str, Any]:
    return {
        "ids": _ids_json(flt.ids) if flt.ids is not None else None,
        "subscription": flt.subscription, "event_type": flt.event_type, "since": since,
    }


def dead_batch(
    conn: sqlite3.Connection, q: Queries, now: float, params: dict[str, Any],
    replay: bool,
) -> tuple[int, int | None, set[str]]:
    """Replay or purge the next batch of matching dead rows.

    Returns how many moved, the last id seen (None when no row matched) and,
    for a replay, the event types to wake.
    """
    ids = [int(r[0]) for r in _all(conn, q["dead_ids"], params)]
    if not ids:
        return 0, None, set()
    batch = {"ids": _ids_json(ids), "now": now}
    if replay:
        rows = _all(conn, q["replay"], batch)
        return len(rows), ids[-1], event_types_of(conn, q, {int(r[0]) for r in rows})
    gone = [int(r[0]) for r in _all(conn, q["purge"], batch)]
    if gone:
        conn.execute(q["purge_history"], {"ids": _ids_json(gone)})
    return len(gone), ids[-1], set()


def event_types_of(conn: sqlite3.Connection, q: Queries, subscription_ids: set[int]) -> set[str]:
    rows = _all(conn, q["subscription_types"], {"ids": _ids_json(sorted(subscription_ids))})
    return {str(r[0]) for r in rows}


def cancel(conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int]) -> int:
    return len(_all(conn, q["cancel"], {"ids": _ids_json(ids), "now": now}))
