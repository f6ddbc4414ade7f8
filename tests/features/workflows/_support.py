"""Helpers of the state-machine tests: run a worker until a condition holds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from eventbus import Bus, Worker

TERMINAL = ("completed", "failed", "cancelled", "uncertain")


async def run_until(
    bus: Bus, done: Callable[[], Awaitable[bool]], timeout: float = 20.0, **options: Any
) -> Worker:
    """Serve the bus with one in-process worker until ``done()`` is true (checked every 20 ms)."""
    worker = Worker(bus, poll_interval_seconds=0.1, **options)
    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            while not await done():
                await anyio.sleep(0.02)
            worker.stop()
    return worker


async def finish(bus: Bus, machine: Any, keys: list[str], timeout: float = 20.0, **options: Any) -> Worker:
    """Run until every instance of ``keys`` is in a terminal (or uncertain) status."""

    async def done() -> bool:
        for key in keys:
            if (await bus.workflows.instance(machine, key)).status not in TERMINAL:
                return False
        return True

    return await run_until(bus, done, timeout, **options)


async def status_is(bus: Bus, machine: Any, key: str, *statuses: str) -> bool:
    return (await bus.workflows.instance(machine, key)).status in statuses


async def step_deliveries(bus: Bus, machine: str, key: str) -> dict[str, list[int]]:
    """Ids of the step deliveries of one instance, by status (read straight from the tables)."""
    backend: Any = bus.backend
    okey = f"{machine}/{key}"
    if bus.backend.kind == "postgres":
        async with backend.db.conn() as conn:
            rows = await conn.fetch(
                f'SELECT id, status FROM "{backend.schema_name}".deliveries WHERE ordering_key = $1', okey
            )
        pairs = [(r["id"], r["status"]) for r in rows]
    else:
        sql = "SELECT id, status FROM deliveries WHERE ordering_key = ?"
        pairs = await backend.db.read(lambda c: [tuple(r) for r in c.execute(sql, (okey,)).fetchall()])
    out: dict[str, list[int]] = {}
    for delivery_id, status in pairs:
        out.setdefault(status, []).append(delivery_id)
    return out


async def expire_approval(bus: Bus, approval_id: int) -> None:
    """Move an approval's expiry into the past, as if its timeout had run out (straight in the table)."""
    backend: Any = bus.backend
    if bus.backend.kind == "postgres":
        async with backend.db.conn() as conn:
            await conn.execute(
                f"UPDATE \"{backend.schema_name}\".wf_approvals SET expires_at = now() - interval '1 second' "
                "WHERE id = $1",
                approval_id,
            )
        return
    sql = "UPDATE wf_approvals SET expires_at = ? WHERE id = ?"
    await backend.db.write(lambda conn, q, now: conn.execute(sql, (now - 1, approval_id)))
