"""Rescue: the processing deliveries of a lost worker go back before their leases run out."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import time
import uuid

import asyncpg
import pytest

from eventbus import Context
from eventbus.backends.base import Completion

from ...conftest import Target
from ...support.helpers import OrderPlaced

pytestmark = pytest.mark.append_only


async def _sql(target: Target, sqlite: str, postgres: str, *args: object) -> None:
    """One statement on the test's own store, outside the bus (as another process would)."""
    if target.kind == "sqlite":
        with sqlite3.connect(target.dsn.removeprefix("sqlite:///")) as db:
            db.execute(sqlite, args)
        return
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(postgres.replace("{s}", f'"{target.schema}"'), *args)
    finally:
        await conn.close()


def _dead_pid() -> int:
    """The id of a process of this host that has ended."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


async def _bus_with_claims(make_bus, count: int, worker_id: str):
    bus = await make_bus()

    @bus.subscribe(OrderPlaced, name="h", lease_seconds=3600)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    sub_id = (await bus.register())["h"]
    for i in range(count):
        await bus.publish(OrderPlaced(order_id=f"o-{i}"))
    claimed = await bus.backend.deliveries.claim(sub_id, count, 3600, worker_id)
    assert len(claimed) == count
    return bus, claimed


async def test_a_silent_workers_deliveries_are_taken_back_and_its_results_refused(make_bus, target) -> None:
    lost = str(uuid.uuid4())
    bus, claimed = await _bus_with_claims(make_bus, 3, lost)
    await bus.backend.deliveries.worker_beat(lost)
    assert await bus.backend.deliveries.rescue(10) == []  # it beat just now: alive, however slow
    await _sql(
        target,
        "UPDATE workers SET heartbeat_at = heartbeat_at - 60 WHERE id = ?",
        "UPDATE {s}.workers SET heartbeat_at = heartbeat_at - interval '60 seconds' WHERE id = $1",
        lost if target.kind == "sqlite" else uuid.UUID(lost),
    )
    (rescue,) = await bus.backend.deliveries.rescue(10)
    assert (rescue.worker_id, rescue.reason, rescue.deliveries) == (lost, "silent", 3)
    assert rescue.silent_seconds >= 59 and rescue.hostname == socket.gethostname()
    assert await bus.backend.deliveries.rescue(10) == []  # nothing left to take
    for d in claimed:
        detail = await bus.delivery(d.id)
        assert detail.status == "pending" and detail.attempts == 1
        assert [a.error_type for a in detail.history] == ["WorkerLost"]
    stale = [Completion(d.id, d.lease_token, ()) for d in claimed]
    assert await bus.backend.deliveries.complete(stale) == set()  # fenced: its results are refused
    (row,) = [w for w in (await bus.status()).workers if w.id == lost]
    assert row.rescued == 3


async def test_a_worker_whose_process_is_gone_from_this_host_is_rescued_at_once(make_bus, target) -> None:
    gone, alive = str(uuid.uuid4()), str(uuid.uuid4())
    bus, claimed = await _bus_with_claims(make_bus, 2, gone)
    pid = _dead_pid()
    host = socket.gethostname()
    for worker_id, worker_pid in ((gone, pid), (alive, 1)):  # pid 1 exists: that worker is kept
        await _sql(
            target,
            "INSERT INTO workers (id, hostname, pid, started_at, heartbeat_at, listener_ok, "
            "listener_reconnects) VALUES (?, ?, ?, ?, ?, 1, 0)",
            "INSERT INTO {s}.workers (id, hostname, pid) VALUES ($1, $2, $3)",
            worker_id if target.kind == "sqlite" else uuid.UUID(worker_id),
            host,
            worker_pid,
            *((time.time(), time.time()) if target.kind == "sqlite" else ()),
        )
    more = await bus.backend.deliveries.claim((await bus.register())["h"], 10, 3600, alive)
    assert more == []  # everything is held by the gone worker
    (rescue,) = await bus.backend.deliveries.rescue(3600)
    assert (rescue.worker_id, rescue.reason, rescue.deliveries, rescue.pid) == (gone, "process gone", 2, pid)
    assert {(await bus.delivery(d.id)).status for d in claimed} == {"pending"}
