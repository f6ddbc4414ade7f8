"""A subscription registered while a publisher's transaction is open still gets its event."""

from __future__ import annotations

import anyio
import asyncpg

from eventbus import Context

from ..helpers import OrderPlaced, counts, drain


async def test_registration_during_an_open_publish_transaction_loses_nothing(pg_target) -> None:
    bus = pg_target.bus()
    await bus.migrate()
    conn = await asyncpg.connect(pg_target.dsn)
    try:

        @bus.subscribe(OrderPlaced, name="late")
        async def late(event: OrderPlaced, ctx: Context) -> None:
            pass

        tx = conn.transaction()
        await tx.start()
        await bus.publish(OrderPlaced(order_id="in-flight"), connection=conn)

        async def commit_soon() -> None:
            await anyio.sleep(0.5)  # registration is waiting for this transaction
            await tx.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit_soon)
            await drain(bus)  # registers "late" while the publish is uncommitted
        await drain(bus)
        assert await counts(bus) == {("late", "completed"): 1}
    finally:
        await conn.close()
        await bus.aclose()
