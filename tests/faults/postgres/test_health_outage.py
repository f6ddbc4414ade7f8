"""A worker's readiness follows the database: not ready while PostgreSQL is down, ready again after."""

from __future__ import annotations

import asyncio

import anyio

from eventbus import Bus, Context, Worker
from eventbus.worker._health import BEAT_STALE_SECONDS, health

from ...support.helpers import OrderPlaced
from ...support.pgserver import PgServer


async def test_readiness_fails_while_the_database_is_down_and_returns_after(tmp_path) -> None:
    server = await asyncio.to_thread(lambda: PgServer().start())
    try:
        bus = Bus(server.dsn, schema="health_outage")

        @bus.subscribe(OrderPlaced, name="h")
        async def handle(event: OrderPlaced, ctx: Context) -> None:
            pass

        await bus.migrate()
        async with bus:
            worker = Worker(bus, poll_interval_seconds=0.5, recovery_interval_seconds=0.5)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                with anyio.fail_after(30):
                    while not worker.health().ready:
                        await anyio.sleep(0.05)

                await asyncio.to_thread(server.stop, "immediate")
                beat = worker.beat_at
                assert beat is not None
                await anyio.sleep(6)  # more than a heartbeat's interval: one write failed
                assert worker.beat_at == beat
                later = health(worker, now=beat + BEAT_STALE_SECONDS + 1)
                assert not later.ready and later.live  # no restart would help: not dead, not ready
                assert later.checks["database"].startswith("last heartbeat written")

                await asyncio.to_thread(server.restart, "fast")
                with anyio.fail_after(60):
                    while worker.beat_at == beat or not worker.health().ready:
                        await anyio.sleep(0.1)
                worker.stop()
    finally:
        await asyncio.to_thread(server.destroy)
