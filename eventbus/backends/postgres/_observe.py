"""PostgreSQL: the chain and health reads of the Inspector, and the RetentionStore."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import orjson

from ...errors import NotFound
from ...types import ChainEvent, HorizonHolder, StatusDetails, TableHealth
from .._observe import (
    COUNT_CAP,
    RECENT_WINDOW,
    Override,
    chain_of,
    event_types_of,
    shortest_cutoff,
    subscriptions_of,
)
from ..base import PruneBatch

__all__ = ["PostgresObserve"]


class PostgresObserve:
    """Mixed into :class:`PostgresBackend`: reads for ``trace`` and ``status``, and pruning."""

    q: dict[str, str]
    schema: str
    notify_channel: str

    def _conn(self) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    async def chain(self, event_id: int, limit: int = 1000) -> list[ChainEvent]:
        async with self._conn() as conn:
            root = await conn.fetchval(self.q["chain_root"], event_id)
            if root is None:
                raise NotFound(f"no event {event_id}")
            events = await conn.fetch(self.q["chain_events"], root, limit)
            deliveries = await conn.fetch(self.q["chain_deliveries"], [e["id"] for e in events])
        return chain_of(events, deliveries)

    async def health(self) -> StatusDetails:
        async with self._conn() as conn:
            types = await conn.fetch(self.q["health_event_types"], COUNT_CAP)
            subs = await conn.fetch(self.q["health_subscriptions"])
            recent = await conn.fetch(self.q["health_completed_recent"], RECENT_WINDOW)
            tables = await conn.fetch(self.q["health_tables"], self.schema)
            horizon = await conn.fetchrow(self.q["health_horizon"])
            last_prune = await conn.fetchval(self.q["health_last_prune"])
        return StatusDetails(
            event_types=event_types_of(types),
            queues=subscriptions_of(subs, recent),
            tables=[TableHealth(**dict(t)) for t in tables],
            horizon=None if horizon is None else HorizonHolder(**dict(horizon)),
            last_prune_at=last_prune,
        )

    @contextlib.asynccontextmanager
    async def prune_lock(self) -> AsyncIterator[bool]:
        async with self._conn() as conn:
            held = bool(await conn.fetchval(self.q["prune_try_lock"], self.notify_channel))
            try:
                yield held
            finally:
                if held:
                    # Shielded: a pooled connection must never keep the lock after a cancel.
                    with anyio.CancelScope(shield=True):
                        await conn.fetchval(self.q["prune_unlock"], self.notify_channel)

    async def prune_batch(
        self,
        after_event_id: int,
        limit: int,
        *,
        completed_seconds: float | None,
        dead_seconds: float | None,
        dedup_seconds: float,
        dry_run: bool = False,
        overrides: Sequence[Override] = (),
    ) -> PruneBatch:
        args = (
            after_event_id,
            limit,
            completed_seconds,
            dead_seconds,
            dedup_seconds,
            dry_run,
            [o[0] for o in overrides],
            [o[1] for o in overrides],
            [o[2] for o in overrides],
            shortest_cutoff(completed_seconds, dead_seconds, overrides),
        )
        async with self._conn() as conn, conn.transaction():
            # Never queue behind (or in front of) another lock holder for long.
            await conn.execute("SET LOCAL lock_timeout = '200ms'")
            row = await conn.fetchrow(self.q["prune_batch"], *args)
        return PruneBatch(
            last_event_id=row["last_id"],
            young=bool(row["young"]),
            completed=row["completed"],
            dead=row["dead"],
            attempts=row["attempts"],
            events=row["events"],
        )

    async def record_prune(self, report: dict[str, Any]) -> None:
        async with self._conn() as conn:
            await conn.execute(self.q["prune_record"], orjson.dumps(report).decode())
