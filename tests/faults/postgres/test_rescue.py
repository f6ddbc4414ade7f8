"""A dead worker's work comes back in seconds, not after its leases; a paused one keeps its work.

Worker A holds 100 ``order`` deliveries (60 s leases, handlers sleeping 30 s).
First it is stopped with SIGSTOP for less than the rescue threshold: worker B
takes nothing from it. Then A is killed with SIGKILL and B completes them all,
long before the leases would have run out: at once when A ran on B's host (its
process is gone), or once A's heartbeat is ``--rescue-after`` seconds old by
the database's clock when A ran under another host name (``unshare --uts``:
needs root, as CI runs).
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from eventbus import Envelope

from ...apps.fault_events import Order
from ...support.processes import EVENTBUS
from ._support import APP, wait_until, worker_id_of

HELD = 100


@pytest.mark.parametrize("where", ["same host", "another host"])
async def test_a_killed_workers_deliveries_are_rescued_and_a_paused_one_keeps_them(
    fault_target, procs, db, where: str
) -> None:
    s = fault_target.schema
    holder = {"FAULT_LEASE": "60", "FAULT_SLEEP": "30"}
    argv = [EVENTBUS, "worker", APP, "--concurrency", str(HELD), "--batch-size", str(HELD)]
    if where == "another host":
        argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', "elsewhere", *argv]
    a = procs.spawn(argv, holder, "a")
    a_id = await worker_id_of(db, s, a.pid)
    bus = fault_target.bus()
    async with bus:
        await bus.publish_many([Envelope(Order(n=i), key=f"o{i}") for i in range(HELD)])

    async def held_by_a() -> bool:
        n = await db.fetchval(
            f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'processing' AND worker_id = $1", a_id
        )
        return n == HELD

    await wait_until(held_by_a, 30, what="worker A to hold every delivery")
    b = procs.worker("--rescue-after", "15", "--poll-interval", "1", env={"FAULT_LEASE": "60"}, name="b")
    await worker_id_of(db, s, b.pid)

    a.signal(signal.SIGSTOP)  # alive but not answering, for less than the threshold
    await asyncio.sleep(8)
    a.signal(signal.SIGCONT)
    assert await held_by_a(), "a paused worker's work was taken"
    lost = f"SELECT count(*) FROM \"{s}\".delivery_attempts WHERE error_type = 'WorkerLost'"
    assert await db.fetchval(lost) == 0

    a.kill()
    killed = time.monotonic()

    async def all_done() -> bool:
        n = await db.fetchval(
            f'SELECT count(*) FROM "{s}".deliveries d JOIN "{s}".subscriptions sub '
            "ON sub.id = d.subscription_id "
            "WHERE sub.name = 'order' AND d.status = 'completed'"
        )
        return n == HELD

    await wait_until(all_done, 50, interval=0.2, what="worker B to complete the rescued deliveries")
    took = time.monotonic() - killed
    assert await db.fetchval(lost) == HELD
    status = procs.status_json()
    (row,) = [w for w in status["workers"] if w["id"] == str(a_id)]
    assert row["rescued"] == HELD
    assert (row["hostname"] == "elsewhere") == (where == "another host")
    print(f"\nrescue ({where}): {HELD} deliveries with 60 s leases completed {took:.1f}s after SIGKILL")
