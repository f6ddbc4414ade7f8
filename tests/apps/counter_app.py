"""A worker application for multi-process tests.

Every handler run is recorded in ``handler_runs`` of the bus's schema, so the
test can count runs per delivery across processes.
"""

from __future__ import annotations

import os

import asyncpg

from eventbus import Bus, Context
from tests.support.helpers import OrderPlaced

bus = Bus()
_pool: asyncpg.Pool | None = None


async def _record(ctx: Context) -> None:
    global _pool
    if _pool is None:
        _pool = await asyncpg.create_pool(os.environ["EVENTBUS_DSN"], min_size=1, max_size=2)
    schema = os.environ["EVENTBUS_SCHEMA"]
    await _pool.execute(
        f'INSERT INTO "{schema}".handler_runs (delivery_id, pid) VALUES ($1, $2)',
        ctx.delivery_id,
        os.getpid(),
    )


@bus.subscribe(OrderPlaced, name="count")
async def count(event: OrderPlaced, ctx: Context) -> None:
    await _record(ctx)
