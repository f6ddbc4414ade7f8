"""Keys kept for good: publishes with ``once=True`` on PostgreSQL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...types import EventId, PublishResult
from ..ports import OutgoingEvent

__all__ = ["publish_kept"]

Publish = Callable[[Any, Sequence[OutgoingEvent]], Awaitable[list[PublishResult]]]


async def publish_kept(
    conn: Any, queries: tuple[str, str], events: Sequence[OutgoingEvent], publish: Publish
) -> list[PublishResult]:
    """Publish a batch with keys to keep for good, in one transaction (a savepoint inside the caller's).

    A key kept by an earlier publish is a duplicate of the event that took it,
    even once that event was pruned; ``publish`` inserts the others, and the
    keys to keep are written with them. ``queries``: the ``kept_keys`` and
    ``keep_keys`` blocks.
    """
    read, keep = queries
    async with conn.transaction():
        keeping = [e for e in events if e.keep_key]
        found = await conn.fetch(read, [e.event_type for e in keeping], [e.key for e in keeping])
        kept = {(r["event_type"], r["key"]): EventId(r["event_id"]) for r in found}
        fresh = [i for i, e in enumerate(events) if not (e.keep_key and (e.event_type, e.key) in kept)]
        results = dict(zip(fresh, await publish(conn, [events[i] for i in fresh]), strict=True))
        new = [(events[i], results[i].event_id) for i in fresh if events[i].keep_key]
        if new:
            await conn.execute(
                keep, [e.event_type for e, _ in new], [e.key for e, _ in new], [i for _, i in new]
            )
    return [
        results[i] if i in results else PublishResult(kept[(e.event_type, e.key)], duplicate=True)
        for i, e in enumerate(events)
    ]
