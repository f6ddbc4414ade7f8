"""The :class:`~eventbus.backends.base.DeliveryStore` port on SQLite: the hot path.

Every write is one ``BEGIN IMMEDIATE`` transaction on the writer's thread
(the functions below taking ``conn, q, now`` are their bodies). Claims
serialise on the file's write lock instead of skipping locked rows, and a
claim or a lease recovery first probes outside any transaction, so an empty
queue never takes the lock.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson

from ...errors import RegistrationError
from ...types import DeliveryId, EventId, PublishResult
from .._workers import lost_workers, rescues_of
from ..base import (
    ClaimedDelivery,
    Completion,
    Failure,
    HandlerTransaction,
    LeaseKey,
    OutgoingEvent,
    Rescue,
    SubscriptionSpec,
    decode_headers,
    warn_not_active,
)
from ._db import SQLiteDb
from ._link import Queries
from ._transaction import handler_transaction
from ._units import Row, event_types_of, ids_json, publish, rows, to_time
from .workflows import start_on

__all__ = ["SQLiteDeliveries"]


class SQLiteDeliveries:
    """Publish, register, claim, settle and lease deliveries in one SQLite file."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def publish(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        if not events:
            return []
        results, types = await self._db.write(publish, events)
        self._db.wake(types)
        return results

    async def publish_serial(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Every write already goes through the one connection's thread."""
        return await self.publish(events)

    async def register(self, specs: Sequence[SubscriptionSpec], *, served: bool = False) -> dict[str, int]:
        return await self._db.write(register, specs, served)

    async def finish_backfills(self) -> int:
        """Nothing is ever owed: the backfill under the write lock in :meth:`register` is complete."""
        return 0

    async def claim(
        self,
        subscription_id: int,
        limit: int,
        lease_seconds: float,
        worker_id: str,
        ordered: bool = False,
        after: Any = None,
    ) -> list[ClaimedDelivery]:
        # ``after`` is a hint for PostgreSQL's MVCC (dead index entries); SQLite
        # updates rows in place, so a claim from the start costs the same.
        del after
        token = str(uuid.uuid4())
        params = {
            "subscription_id": subscription_id,
            "limit": limit,
            "lease_seconds": lease_seconds,
            "lease_token": token,
            "worker_id": worker_id,
        }
        probe = {"subscription_id": subscription_id}
        pairs = await self._db.write_if("claim_probe", probe, claim, params, ordered)
        return [claimed_of(d, e, subscription_id, token) for d, e in pairs or ()]

    async def complete(self, completions: Sequence[Completion]) -> set[LeaseKey]:
        """Mark completed and insert follow-ups, in one transaction, for owned rows only."""
        if not completions:
            return set()
        done, types = await self._db.write(complete, completions)
        self._db.wake(types)
        return done

    def transaction(self, timeout_seconds: float) -> AbstractAsyncContextManager[HandlerTransaction]:
        """The writer's connection in BEGIN IMMEDIATE for a transactional handler (see ``DeliveryStore``)."""
        return handler_transaction(self._db, timeout_seconds, complete)

    async def fail(self, failures: Sequence[Failure]) -> set[LeaseKey]:
        if not failures:
            return set()
        return await self._db.write(fail, failures)

    async def release(self, ids: Sequence[DeliveryId], lease_token: str) -> int:
        if not ids:
            return 0
        moved, types = await self._db.write(release, ids, lease_token)
        self._db.wake(types)  # other processes see the commit (data_version)
        return moved

    async def extend(
        self, ids: Sequence[DeliveryId], lease_token: str, lease_seconds: float
    ) -> set[DeliveryId]:
        if not ids:
            return set()
        return await self._db.write(extend, ids, lease_token, lease_seconds)

    async def recover_expired(self, limit: int = 1000) -> int:
        recovered = await self._db.write_if("recover_probe", {}, recover_expired, limit)
        if recovered is None:
            return 0
        moved, types = recovered
        self._db.wake(types)  # other processes see the commit (data_version)
        return moved

    async def rescue(self, silent_seconds: float, limit: int = 1000) -> list[Rescue]:
        """Take back the processing deliveries of lost workers (see ``DeliveryStore.rescue``).

        The candidates are read without the file's write lock; only a rescue takes it.
        """
        host = socket.gethostname()
        params = {"silent": silent_seconds, "hostname": host, "now": time.time()}
        lost = lost_workers(await self._db.fetch("lost_worker_candidates", params), silent_seconds, host)
        if not lost:
            return []
        taken, types = await self._db.write(rescue, sorted(lost), limit)
        self._db.wake(types)
        return rescues_of(lost, taken)

    async def next_run_in(self, subscription_id: int, after: Any = None) -> float | None:
        found = await self._db.fetch("next_run_in", {"subscription_id": subscription_id})
        value = found[0][0] if found else None
        return None if value is None else float(value)

    upkeep_seconds: float | None = None
    """The file needs no upkeep beside claiming (see ``DeliveryStore.upkeep``)."""

    async def upkeep(self) -> None:
        """Nothing to do: rows are updated in place and pruned by retention."""

    async def worker_beat(
        self, worker_id: str, *, gone: bool = False, subscription_ids: Sequence[int] = ()
    ) -> None:
        """Record the worker's heartbeat, then keep the WAL bounded."""
        listener = self._db.listener
        report = {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "listener_ok": int(listener.healthy),
            "listener_reconnects": listener.reconnects,
        }
        await self._db.write(worker_beat, None if gone else report, worker_id, list(subscription_ids))
        if not gone:
            await self._db.checkpoint()


def claimed_of(d: Row, e: Row, subscription_id: int, token: str) -> ClaimedDelivery:
    """A claimed delivery from its claimed row and its event's row.

    Written out by hand, not through ``row_as``: every delivery a worker runs
    passes here, and the generic conversion costs about twice as much per row.
    """
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
        event_version=e["version"],
        priority=e["priority"],
    )


# -- units of work (on the writer's thread, under the write lock) ---------------------


def register(
    conn: sqlite3.Connection, q: Queries, now: float, specs: Sequence[SubscriptionSpec], served: bool
) -> dict[str, int]:
    """Upsert subscriptions by name; backfill new ones that start from the earliest event.

    Under the write lock no publish can be half done, so the one backfill sees
    every event committed before it and every later publish sees the
    subscription.
    """
    return {spec.name: _register_one(conn, q, now, spec, served) for spec in specs}


def _register_one(
    conn: sqlite3.Connection, q: Queries, now: float, spec: SubscriptionSpec, served: bool
) -> int:
    params: dict[str, Any] = {
        "name": spec.name,
        "event_type": spec.event_type,
        "max_attempts": spec.max_attempts,
        "lease_seconds": spec.lease_seconds,
        "ordered": int(spec.ordered),
        "served": int(served),
        "now": now,
    }
    found = rows(conn, q["subscription_by_name"], {"name": spec.name})
    if not found:
        sub_id = int(rows(conn, q["subscription_insert"], params)[0][0])
        if spec.start_from == "earliest":
            backfill = {"subscription_id": sub_id, "event_type": spec.event_type, "now": now}
            conn.execute(q["backfill"], {**backfill, "ordered": params["ordered"]})
        return sub_id
    row = found[0]
    if row["event_type"] != spec.event_type:
        raise RegistrationError(
            f"subscription {spec.name!r} is already bound to another event type; "
            "pick a new name for a new event type"
        )
    if served and row["state"] != "active":
        warn_not_active(spec.name, row["state"])
    conn.execute(q["subscription_update"], {**params, "id": row["id"]})
    if bool(row["ordered"]) != spec.ordered:
        conn.execute(q["rekey"], {"subscription_id": row["id"], "ordered": params["ordered"]})
    return int(row["id"])


def claim(
    conn: sqlite3.Connection, q: Queries, now: float, params: dict[str, Any], ordered: bool
) -> list[tuple[Row, Row]]:
    """Lease runnable deliveries; return (delivery, event) row pairs in claim order."""
    params = {**params, "now": now}
    try:
        taken = rows(conn, q["claim_ordered" if ordered else "claim"], params)
    except sqlite3.IntegrityError:
        # deliveries_one_per_key: cannot happen under the write lock, but the
        # index is the rule, so a violation means "nothing claimable now".
        return []
    if not taken:
        return []
    taken.sort(key=lambda r: (r["place"], r["run_at"], r["id"]))  # the claim order
    event_ids = ids_json([r["event_id"] for r in taken])
    events = {int(r["id"]): r for r in rows(conn, q["claimed_events"], {"event_ids": event_ids})}
    return [(r, events[int(r["event_id"])]) for r in taken]


def complete(
    conn: sqlite3.Connection, q: Queries, now: float, completions: Sequence[Completion]
) -> tuple[set[LeaseKey], set[str]]:
    """Complete owned deliveries, publish their follow-ups and start their runs in the same transaction.

    Follow-ups and starts are kept by (delivery, token): a stale run of a
    delivery whose fresh run completes in the same batch adds none. Returns
    the leases applied and the event types the follow-ups and starts wake.
    """
    done: set[LeaseKey] = set()
    for c in completions:
        params = {"id": c.delivery_id, "lease_token": c.lease_token, "now": now}
        if rows(conn, q["complete"], params):
            done.add((c.delivery_id, c.lease_token))
    types: set[str] = set()
    follow_ups = [e for c in completions if c.follow_ups and c.lease in done for e in c.follow_ups]
    if follow_ups:
        types |= publish(conn, q, now, follow_ups)[1]
    for start in (s for c in completions if c.starts and c.lease in done for s in c.starts):
        types |= start_on(conn, q, now, start)[1]
    return done, types


def fail(conn: sqlite3.Connection, q: Queries, now: float, failures: Sequence[Failure]) -> set[LeaseKey]:
    """Retry or bury owned deliveries, appending each attempt to the history."""
    return {f.lease for f in failures if _fail_one(conn, q, now, f)}


def _fail_one(conn: sqlite3.Connection, q: Queries, now: float, f: Failure) -> bool:
    moved = rows(
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
    if not moved:
        return False
    conn.execute(
        q["attempt_record"],
        {
            "delivery_id": f.delivery_id,
            "attempt": moved[0]["attempts"],
            "error_type": f.error_type,
            "message": f.message,
            "traceback": f.traceback,
            "duration_seconds": f.duration_seconds,
            "worker_id": f.worker_id,
            "now": now,
        },
    )
    return True


def release(
    conn: sqlite3.Connection, q: Queries, now: float, ids: Sequence[int], lease_token: str
) -> tuple[int, set[str]]:
    """Hand back owned deliveries; how many moved and the event types to wake."""
    moved = rows(conn, q["release"], {"ids": ids_json(ids), "lease_token": lease_token, "now": now})
    return len(moved), event_types_of(conn, q, {int(r[0]) for r in moved})


def extend(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    ids: Sequence[int],
    lease_token: str,
    lease_seconds: float,
) -> set[DeliveryId]:
    params = {"ids": ids_json(ids), "lease_token": lease_token, "lease_seconds": lease_seconds, "now": now}
    return {DeliveryId(int(r[0])) for r in rows(conn, q["extend"], params)}


def recover_expired(conn: sqlite3.Connection, q: Queries, now: float, limit: int) -> tuple[int, set[str]]:
    """Expired leases: the attempt counts; back to pending, or dead when out of attempts.

    Returns how many were recovered and the event types to wake.
    """
    recovered = rows(conn, q["recover_expired"], {"limit": limit, "now": now})
    _record_attempts(conn, q["recover_record"], recovered, now)
    return len(recovered), event_types_of(conn, q, {int(r["subscription_id"]) for r in recovered})


def rescue(
    conn: sqlite3.Connection, q: Queries, now: float, worker_ids: list[str], limit: int
) -> tuple[dict[str, int], set[str]]:
    """The processing deliveries of ``worker_ids``, as :func:`recover_expired` moves expired ones.

    Returns how many were taken from each worker and the event types to wake.
    """
    taken = rows(conn, q["rescue"], {"ids": orjson.dumps(worker_ids).decode(), "limit": limit, "now": now})
    _record_attempts(conn, q["rescue_record"], taken, now)
    counts = Counter(str(r["worker_id"]) for r in taken)
    conn.executemany(q["rescue_count"], [{"id": i, "n": n} for i, n in counts.items()])
    return dict(counts), event_types_of(conn, q, {int(r["subscription_id"]) for r in taken})


def _record_attempts(conn: sqlite3.Connection, sql: str, moved: Sequence[Row], now: float) -> None:
    """The lost attempt of each delivery ``moved`` back (by lease expiry or rescue), with ``sql``."""
    conn.executemany(
        sql,
        [
            {"delivery_id": r["id"], "attempt": r["attempts"], "worker_id": r["worker_id"], "now": now}
            for r in moved
        ],
    )


def worker_beat(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    report: dict[str, Any] | None,
    worker_id: str,
    subscription_ids: Sequence[int],
) -> None:
    """A live worker's heartbeat (and the subscriptions it serves), or, with no report, its leaving."""
    if report is None:
        conn.execute(q["worker_gone"], {"id": worker_id, "now": now})
        return
    conn.execute(q["worker_beat"], {**report, "id": worker_id, "now": now})
    if subscription_ids:
        conn.execute(q["subscriptions_seen"], {"ids": ids_json(subscription_ids), "now": now})
