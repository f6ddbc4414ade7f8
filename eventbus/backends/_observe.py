"""Reads shared by both backends' chain and health queries: rows to value types."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..types import (
    ChainDelivery,
    ChainEvent,
    DeliveryId,
    EventId,
    EventTypeRow,
    SubscriptionStatus,
    trace_id_of,
)
from .base import decode_headers
from .ports import RollupBucket

__all__ = [
    "COUNT_CAP",
    "RECENT_WINDOW",
    "Override",
    "chain_of",
    "event_types_of",
    "rollup_buckets",
    "shortest_cutoff",
    "subscriptions_of",
]

Override = tuple[str, float | None, float | None]
"""A subscription's own retention: (name, completed seconds, dead seconds); None keeps."""


def shortest_cutoff(completed: float | None, dead: float | None, overrides: Sequence[Override]) -> float:
    """The shortest retention of all: events younger than it cannot lose anything yet."""
    values = [completed, dead, *(o[1] for o in overrides), *(o[2] for o in overrides)]
    return min((v for v in values if v is not None), default=0.0)


COUNT_CAP = 100_000
"""Events of one type are counted up to this many."""
RECENT_WINDOW = 100_000
"""Completions of the last hour are looked for among this many newest deliveries."""


def chain_of(events: Sequence[Any], deliveries: Sequence[Any]) -> list[ChainEvent]:
    """Rows (mappings) of both backends to flat :class:`ChainEvent` values."""
    by_event: dict[int, list[ChainDelivery]] = {}
    for d in deliveries:
        by_event.setdefault(int(d["event_id"]), []).append(
            ChainDelivery(
                id=DeliveryId(d["id"]),
                subscription=d["subscription"],
                status=d["status"],
                attempts=d["attempts"],
                last_error=d["last_error"],
                replays=d["replays"],
                updated_at=d["updated_at"],
                elapsed_seconds=d["elapsed_seconds"],
                last_attempt_seconds=d["last_attempt_seconds"],
            )
        )
    out = []
    for e in events:
        headers = decode_headers(e["headers"])
        out.append(
            ChainEvent(
                id=EventId(e["id"]),
                event_type=e["event_type"],
                key=e["key"],
                correlation_id=EventId(e["correlation_id"] or e["id"]),
                causation_id=None if e["causation_id"] is None else EventId(e["causation_id"]),
                created_at=e["created_at"],
                trace_id=trace_id_of(headers),
                deliveries=by_event.get(int(e["id"]), []),
            )
        )
    return out


def subscriptions_of(
    rows: Sequence[Any], recent: Sequence[Any], window: int = RECENT_WINDOW
) -> list[SubscriptionStatus]:
    completed = {r["subscription_id"]: int(r["n"] or 0) for r in recent}
    capped = sum(int(r["examined"]) for r in recent) >= window
    return [
        SubscriptionStatus(
            name=r["name"],
            event_type=r["event_type"],
            backlog=r["backlog"],
            scheduled=r["scheduled"],
            lag_seconds=r["lag_seconds"],
            in_flight=r["in_flight"],
            stuck=r["stuck"],
            dead=r["dead"],
            completed_last_hour=completed.get(r["id"], 0),
            completed_last_hour_capped=capped,
            last_seen_at=r["last_seen_at"],
        )
        for r in rows
    ]


def event_types_of(
    rows: Sequence[Any], version_rows: Sequence[Any] = (), cap: int = COUNT_CAP
) -> list[EventTypeRow]:
    """Event type rows, each with its versions (a type with no row in ``version_rows`` is all version 1)."""
    versions: dict[str, dict[int, int]] = {}
    for v in version_rows:
        if v["events"]:
            versions.setdefault(v["event_type"], {})[int(v["version"])] = int(v["events"])
    return [
        EventTypeRow(
            event_type=r["event_type"],
            events=r["events"],
            events_capped=r["events"] >= cap,
            subscriptions=r["subscriptions"],
            versions=versions.get(r["event_type"]) or ({1: r["events"]} if r["events"] else {}),
        )
        for r in rows
    ]


def rollup_buckets(counts: Sequence[Any], durations: Sequence[Any]) -> list[RollupBucket]:
    """Rollup steps from the rows of ``rollup_counts`` and ``rollup_durations`` (either backend)."""
    runs: dict[tuple[str, int], dict[int, int]] = {}
    for d in durations:
        runs.setdefault((d["subscription"], int(d["start"])), {})[int(d["bucket"])] = int(d["runs"])
    return [_bucket(c, runs.get((c["subscription"], int(c["start"])), {})) for c in counts]


def _bucket(c: Any, durations: dict[int, int]) -> RollupBucket:
    return RollupBucket(
        subscription=c["subscription"], start=int(c["start"]), completed=int(c["completed"]),
        failed=int(c["failed"]), dead=int(c["dead"]), durations=durations,
        pending=None if c["pending"] is None else int(c["pending"]), lag_seconds=c["lag_seconds"],
    )  # fmt: skip
