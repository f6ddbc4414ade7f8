"""The LISTEN connection is killed by the server: pickup continues, it reconnects."""

from __future__ import annotations

import time

from eventbus import Envelope

from ...apps.fault_events import Audit
from ._support import socket_ports_of, wait_until, worker_id_of

POLL = 3.0


async def _listener_backend(db, pid: int) -> int | None:
    """The backend of the worker's LISTEN connection (by the worker's client ports)."""
    ports = socket_ports_of(pid)
    return await db.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1::int[]) "
        "AND (query LIKE 'LISTEN%' OR query = 'SELECT pg_notify($1, $2)')",
        list(ports),
    )


async def _pickup_seconds(bus, db, s: str, n: int) -> float:
    t0 = time.monotonic()
    (result,) = await bus.publish_many([Envelope(Audit(n=n), key=f"a{n}")])

    async def picked() -> bool:
        return bool(
            await db.fetchval(f'SELECT count(*) FROM "{s}".handler_runs WHERE event_id = $1', result.event_id)
        )

    await wait_until(picked, POLL + 5, interval=0.01, what=f"pickup of event {n}")
    return time.monotonic() - t0


async def test_listen_connection_killed(fault_target, procs, db) -> None:
    s = fault_target.schema
    w = procs.worker("--poll-interval", str(POLL), env={"FAULT_LEASE": "10"}, name="listen")
    wid = await worker_id_of(db, s, w.pid)

    async def listener_ok() -> bool:
        return bool(await db.fetchval(f'SELECT listener_ok FROM "{s}".workers WHERE id = $1', wid))

    await wait_until(listener_ok, 15, what="the worker's listener to report healthy")
    old = await wait_until(lambda: _listener_backend(db, w.pid), 10, what="LISTEN backend")
    bus = fault_target.bus()
    async with bus:
        assert await _pickup_seconds(bus, db, s, 0) < 1.0  # baseline: woken by NOTIFY

        assert await db.fetchval("SELECT pg_terminate_backend($1)", old)
        first = await _pickup_seconds(bus, db, s, 1)
        assert first <= POLL + 1.0, f"pickup took {first:.2f}s after the listener was killed"

        # The listener reconnects and says so in `eventbus status --json`.
        def reconnected() -> dict | None:
            for worker in procs.status_json()["workers"]:
                if worker["pid"] == w.pid and worker["listener_reconnects"] >= 1 and worker["listener_ok"]:
                    return worker
            return None

        async def poll_status() -> dict | None:
            return reconnected()

        t0 = time.monotonic()
        await wait_until(poll_status, 15, interval=0.5, what="listener_reconnects to increment")
        reported = time.monotonic() - t0
        new = await wait_until(lambda: _listener_backend(db, w.pid), 10, what="new LISTEN backend")
        assert new != old
        # Woken by NOTIFY again, well inside the slow poll.
        again = await _pickup_seconds(bus, db, s, 2)
        assert again < 1.0, f"pickup took {again:.2f}s: the new LISTEN connection is not used"
    print(
        f"\nLISTEN killed: pickup {first:.2f}s after kill, reconnect reported in status "
        f"after {reported:.1f}s, pickup after reconnect {again:.2f}s"
    )
