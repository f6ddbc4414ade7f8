"""The units of work of the SQLite backend, and row conversions.

Each write function here is the body of one transaction: it takes the
connection, the queries and ``now`` (the database clock at BEGIN IMMEDIATE),
and runs on the connection's worker thread through
:func:`._sqlite_conn.write`, so nothing is awaited while the write lock is held.
Times are stored as REAL epoch seconds and returned as aware UTC datetimes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from ...errors import NotFound, PublishError, RegistrationError
from ...types import (
    AttemptRecord,
    DeadLetterFilter,
    DeliveryDetail,
    DeliveryId,
    EventId,
    PublishResult,
    SubscriptionInfo,
)
from .. import _migrations as migrations
from ..base import (
    ClaimedDelivery,
    Completion,
    Failure,
    LeaseKey,
    OutgoingEvent,
    SubscriptionSpec,
    decode_headers,
    warn_not_active,
)
from ._link import Queries

Row = sqlite3.Row


def _all(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[Row]:
    # Always drain: a RETURNING statement must run to completion before COMMIT.
    return conn.execute(sql, params).fetchall()


def _ids_json(ids: Sequence[int]) -> str:
    return orjson.dumps([int(i) for i in ids]).decode()


def to_time(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC)


def to_epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def detail_of(row: sqlite3.Row, history: Sequence[AttemptRecord] = ()) -> DeliveryDetail:
    return DeliveryDetail(
        id=DeliveryId(row["id"]),
        event_id=EventId(row["event_id"]),
        subscription=row["subscription"],
        event_type=row["event_type"],
        status=row["status"],
        attempts=row["attempts"],
        key=row["key"],
        payload=bytes(row["payload"]),
        headers=decode_headers(row["headers"]),
        correlation_id=row["correlation_id"],
        causation_id=row["causation_id"],
        last_error=row["last_error"],
        replays=row["replays"],
        run_at=to_time(row["run_at"]),
        updated_at=to_time(row["updated_at"]),
        created_at=to_time(row["created_at"]),
        history=history,
    )


def attempt_of(row: sqlite3.Row) -> AttemptRecord:
    return AttemptRecord(
        attempt=row[0],
        error_type=row[1],
        message=row[2],
        traceback=row[3],
        duration_seconds=float(row[4]),
        worker_id=row[5],
        failed_at=to_time(row[6]),
    )


def claimed_of(pair: tuple[sqlite3.Row, sqlite3.Row], subscription_id: int, token: str) -> ClaimedDelivery:
    d, e = pair
    return ClaimedDelivery(
        id=DeliveryId(d["id"]),
        event_id=EventId(d["event_id"]),
        subscription_id=subscription_id,
        attempts=d["attempts"],
        lease_token=token,
        event_type=e["event_type"],
        payload=bytes(e["payload"]),
        headers=decode_headers(e["headers"]),
        key=e["key"],
        correlation_id=e["correlation_id"],
        ordering_key=d["ordering_key"],
        created_at=to_time(e["created_at"]),
        run_at=to_time(d["run_at"]),
        causation_id=e["causation_id"],
    )


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
    conn.execute(
        q["migration_record"],
        {
            "version": m.version,
            "name": m.name,
            "checksum": m.checksum,
            "now": now,
        },
    )
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
            {
                "event_id": event_id,
                "subscription_id": sub_id,
                "run_at": deliver_at,
                "now": now,
                "ordering_key": e.ordering_key if ordered else None,
            }
            for sub_id, ordered in subscribers.get(e.event_type, ())
        )
    if fanout:
        conn.executemany(q["fanout"], fanout)
    return results, inserted


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
        "now": now,
    }


def _existing_id(conn: sqlite3.Connection, q: Queries, e: OutgoingEvent) -> EventId:
    rows = _all(conn, q["existing_id"], {"event_type": e.event_type, "key": e.key})
    if not rows:
        raise PublishError(f"event {e.event_type}/{e.key} conflicted with a row it cannot see")
    return EventId(int(rows[0][0]))


def register(
    conn: sqlite3.Connection, q: Queries, now: float, specs: Sequence[SubscriptionSpec], served: bool
) -> dict[str, int]:
    """Upsert subscriptions by name; backfill new ones that start from the earliest event.

    Under the write lock no publish can be half done, so the one backfill sees
    every event committed before it and every later publish sees the
    subscription.
    """
    ids: dict[str, int] = {}
    for spec in specs:
        params: dict[str, Any] = {
            "name": spec.name,
            "event_type": spec.event_type,
            "max_attempts": spec.max_attempts,
            "lease_seconds": spec.lease_seconds,
            "ordered": int(spec.ordered),
            "served": int(served),
            "now": now,
        }
        found = _all(conn, q["subscription_by_name"], {"name": spec.name})
        if found and found[0][1] != spec.event_type:
            raise RegistrationError(
                f"subscription {spec.name!r} is already bound to another event type; "
                "pick a new name for a new event type"
            )
        if found:
            ids[spec.name] = int(found[0][0])
            if served and found[0][2] != "active":
                warn_not_active(spec.name, found[0][2])
            conn.execute(q["subscription_update"], {**params, "id": ids[spec.name]})
            if bool(found[0]["ordered"]) != spec.ordered:
                conn.execute(q["rekey"], {"subscription_id": ids[spec.name], "ordered": params["ordered"]})
            continue
        ids[spec.name] = int(_all(conn, q["subscription_insert"], params)[0][0])
        if spec.start_from == "earliest":
            backfill(conn, q, now, ids[spec.name], spec)
    return ids


def backfill(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    subscription_id: int,
    spec: SubscriptionSpec,
) -> None:
    conn.execute(
        q["backfill"],
        {
            "subscription_id": subscription_id,
            "event_type": spec.event_type,
            "ordered": int(spec.ordered),
            "now": now,
        },
    )


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
) -> tuple[set[LeaseKey], list[PublishResult], set[str]]:
    """Complete owned deliveries and publish their follow-ups in the same transaction.

    Follow-ups are kept by (delivery, token): a stale run of a delivery whose
    fresh run completes in the same batch adds none.
    """
    done: set[LeaseKey] = set()
    for c in completions:
        params = {"id": c.delivery_id, "lease_token": c.lease_token, "now": now}
        if _all(conn, q["complete"], params):
            done.add((c.delivery_id, c.lease_token))
    follow_ups = [e for c in completions if c.follow_ups and c.lease in done for e in c.follow_ups]
    if not follow_ups:
        return done, [], set()
    results, types = publish(conn, q, now, follow_ups)
    return done, results, types


def fail(conn: sqlite3.Connection, q: Queries, now: float, failures: Sequence[Failure]) -> set[LeaseKey]:
    """Retry or bury owned deliveries, appending each attempt to the history."""
    failed: set[LeaseKey] = set()
    for f in failures:
        rows = _all(
            conn,
            q["fail"],
            {
                "id": f.delivery_id,
                "lease_token": f.lease_token,
                "dead": int(f.dead),
                "delay_seconds": f.retry_delay_seconds,
                "error_type": f.error_type,
                "message": f.message,
                "now": now,
            },
        )
        if not rows:
            continue
        failed.add(f.lease)
        conn.execute(
            q["attempt_record"],
            {
                "delivery_id": f.delivery_id,
                "attempt": rows[0]["attempts"],
                "error_type": f.error_type,
                "message": f.message,
                "traceback": f.traceback,
                "duration_seconds": f.duration_seconds,
                "worker_id": f.worker_id,
                "now": now,
            },
        )
    return failed


def release(
    conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int], lease_token: str
) -> tuple[int, set[str]]:
    """Hand back owned deliveries; how many moved and the event types to wake."""
    rows = _all(conn, q["release"], {"ids": _ids_json(ids), "lease_token": lease_token, "now": now})
    return len(rows), event_types_of(conn, q, {int(r[0]) for r in rows})


def extend(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    ids: Sequence[int],
    lease_token: str,
    lease_seconds: float,
) -> set[DeliveryId]:
    rows = _all(
        conn,
        q["extend"],
        {
            "ids": _ids_json(ids),
            "lease_token": lease_token,
            "lease_seconds": lease_seconds,
            "now": now,
        },
    )
    return {DeliveryId(int(r[0])) for r in rows}


def recover_expired(conn: sqlite3.Connection, q: Queries, now: float, limit: int) -> tuple[int, set[str]]:
    """Expired leases: the attempt counts; back to pending, or dead when out of attempts.

    Returns how many were recovered and the event types to wake.
    """
    rows = _all(conn, q["recover_expired"], {"limit": limit, "now": now})
    conn.executemany(
        q["recover_record"],
        [
            {"delivery_id": r["id"], "attempt": r["attempts"], "worker_id": r["worker_id"], "now": now}
            for r in rows
        ],
    )
    return len(rows), event_types_of(conn, q, {int(r["subscription_id"]) for r in rows})


def worker_beat(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    params: dict[str, Any] | None,
    worker_id: str,
    subscription_ids: Sequence[int],
) -> None:
    if params is None:
        conn.execute(q["worker_gone"], {"id": worker_id, "now": now})
        return
    conn.execute(q["worker_beat"], {**params, "id": worker_id, "now": now})
    if subscription_ids:
        conn.execute(q["subscriptions_seen"], {"ids": _ids_json(subscription_ids), "now": now})


# -- operations --------------------------------------------------------------------


def filter_params(flt: DeadLetterFilter, since: float | None) -> dict[str, Any]:
    return {
        "ids": _ids_json(flt.ids) if flt.ids is not None else None,
        "subscription": flt.subscription,
        "event_type": flt.event_type,
        "since": since,
    }


def replay(conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int]) -> tuple[int, set[str]]:
    """Dead -> pending for ``ids``; how many moved and the event types to wake."""
    rows = _all(conn, q["replay"], {"ids": _ids_json(ids), "now": now})
    return len(rows), event_types_of(conn, q, {int(r[0]) for r in rows})


def purge(conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int]) -> int:
    """Delete the dead deliveries among ``ids`` and their attempt history."""
    gone = [int(r[0]) for r in _all(conn, q["purge"], {"ids": _ids_json(ids), "now": now})]
    if gone:
        conn.execute(q["purge_history"], {"ids": _ids_json(gone)})
    return len(gone)


def event_types_of(conn: sqlite3.Connection, q: Queries, subscription_ids: set[int]) -> set[str]:
    rows = _all(conn, q["subscription_types"], {"ids": _ids_json(sorted(subscription_ids))})
    return {str(r[0]) for r in rows}


def cancel(conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int]) -> int:
    return len(_all(conn, q["cancel"], {"ids": _ids_json(ids), "now": now}))


def subscription_of(row: sqlite3.Row) -> SubscriptionInfo:
    worker_seen_at = row["worker_seen_at"]
    return SubscriptionInfo(
        name=row["name"],
        event_type=row["event_type"],
        state=row["state"],
        ordered=bool(row["ordered"]),
        created_at=to_time(row["created_at"]),
        worker_seen_at=None if worker_seen_at is None else to_time(worker_seen_at),
        silent_seconds=row["silent_seconds"],
        pending=row["pending"],
        processing=row["processing"],
        dead=row["dead"],
        lag_seconds=row["lag_seconds"],
    )


def move_subscription(
    conn: sqlite3.Connection, q: Queries, now: float, name: str, state: str, from_states: Sequence[str]
) -> tuple[int, str] | None:
    """One guarded state change: (id, event type) when it moved; :class:`NotFound` if no such name."""
    params = {"name": name, "state": state, "from_states": orjson.dumps(list(from_states)).decode()}
    rows = _all(conn, q["subscription_state"], params)
    if rows:
        return int(rows[0][0]), str(rows[0][1])
    if not _all(conn, q["subscription_exists"], {"name": name}):
        raise NotFound(f"no subscription named {name!r}")
    return None


def remove_subscription(conn: sqlite3.Connection, q: Queries, now: float, name: str) -> int:
    """Mark removed and cancel its pending deliveries, in one transaction."""
    # Again on a removed one: a delivery that was running then may have come back to pending.
    moved = move_subscription(conn, q, now, name, "removed", ("active", "paused", "removed"))
    if moved is None:
        return 0
    return conn.execute(q["cancel_subscription"], {"subscription_id": moved[0], "now": now}).rowcount
