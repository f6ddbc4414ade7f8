"""eventbus.testing: the temporary bus and drain that users test their handlers with."""

from __future__ import annotations

import os

import asyncpg

from eventbus import Context, Router
from eventbus.testing import drain, temporary_bus

from ..support.helpers import OrderPlaced, PaymentRequested, counts

app = Router()
paid: list[str] = []


@app.subscribe(OrderPlaced, name="charge")
async def charge(event: OrderPlaced, ctx: Context) -> None:
    ctx.emit(PaymentRequested(order_id=event.order_id))


@app.subscribe(PaymentRequested, name="pay")
async def pay(event: PaymentRequested, ctx: Context) -> None:
    paid.append(event.order_id)


async def test_temporary_sqlite_bus_runs_a_chain_and_leaves_nothing_behind() -> None:
    paid.clear()
    async with temporary_bus(router=app) as bus:
        path = bus.backend.db.path  # type: ignore[attr-defined]
        await bus.publish(OrderPlaced(order_id="o-1"))
        drained = await drain(bus)
        assert paid == ["o-1"] and drained.processed == 2
        assert await counts(bus) == {("charge", "completed"): 1, ("pay", "completed"): 1}
    assert not os.path.exists(path)


async def test_temporary_postgres_bus_gets_a_fresh_schema_and_drops_it(pg_dsn: str) -> None:
    paid.clear()
    async with temporary_bus(pg_dsn, router=app) as bus:
        schema = bus.backend.schema_name  # type: ignore[attr-defined]
        await bus.publish(OrderPlaced(order_id="o-2"))
        await drain(bus)
        assert paid == ["o-2"]
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema) == 0
    finally:
        await conn.close()
