"""SIGTERM under load: a worker stopping gracefully leaves no claimed rows behind."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.apps.fault_events import Order

from ._support import settled, wait_until, worker_id_of


@pytest.mark.parametrize(
    ("grace", "sleep"),
    [("0.5", "30"), ("10", "1.5")],
    ids=["handlers-cut-by-grace", "handlers-finish-in-grace"],
)
async def test_sigterm_under_load_leaves_no_claims(fault_target, procs, db, grace, sleep) -> None:
    s = fault_target.schema
    bus = fault_target.bus()
    async with bus:
        from eventbus import Envelope

        await bus.publish_many([Envelope(Order(n=i), key=f"k{i}") for i in range(200)])
    w = procs.worker(
        "--concurrency",
        "60",
        "--batch-size",
        "30",
        "--grace",
        grace,
        env={"FAULT_SLEEP": sleep, "FAULT_LEASE": "30"},
        name="term",
    )
    wid = await worker_id_of(db, s, w.pid)

    async def busy() -> bool:
        n = await db.fetchval(
            f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'processing' AND worker_id = $1", wid
        )
        return n >= 40

    await wait_until(busy, 20, what="40 deliveries in flight")
    in_flight = await db.fetchval(
        f"SELECT count(*) FROM \"{s}\".deliveries WHERE status='processing' AND worker_id=$1", wid
    )
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    rc = await w.wait_async(float(grace) + 15)
    exit_seconds = time.monotonic() - t0
    assert rc == 0, w.output()
    print(
        f"\nSIGTERM with {in_flight} in flight (grace {grace}s, handler {sleep}s): "
        f"exited in {exit_seconds:.2f}s"
    )

    left = await db.fetchval(
        f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'processing' AND worker_id = $1", wid
    )
    assert left == 0, "claimed rows left behind after SIGTERM"
    assert await db.fetchval(f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'dead'") == 0
    if float(sleep) > float(grace):
        # Handlers cut off when the grace period ended counted one failed attempt each
        # (a hung handler must not escape its retry limit by restarts); the rest,
        # claimed but never started, were handed back without counting.
        cut = await db.fetch(f'SELECT delivery_id, attempt, error_type FROM "{s}".delivery_attempts')
        assert len(cut) == in_flight
        assert {(r["attempt"], r["error_type"]) for r in cut} == {(1, "HandlerInterrupted")}
        counted = await db.fetchval(
            f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'pending' AND attempts <> 0"
        )
        assert counted == in_flight
        await asyncio.sleep(1.5)  # their retry backoff (base 1 s, jitter 0.2)
    else:
        # Nothing was counted as a failed attempt.
        assert await db.fetchval(f'SELECT count(*) FROM "{s}".delivery_attempts') == 0
        finished = await db.fetchval(
            f"SELECT count(*) FROM \"{s}\".handler_runs WHERE phase = 'end' AND subscription = 'order'"
        )
        completed = await db.fetchval(
            f'SELECT count(*) FROM "{s}".deliveries d JOIN "{s}".subscriptions s '
            "ON s.id = d.subscription_id WHERE s.name = 'order' AND d.status = 'completed'"
        )
        assert completed >= in_flight and completed == finished
    assert w.alive() is False
    # A fresh burst worker finishes the rest: every order completed once, one follow-up each.
    drain = procs.worker("--burst", "--concurrency", "100", env={"FAULT_LEASE": "30"}, name="drain")
    assert await drain.wait_async(40) == 0, drain.output()
    assert await settled(db, s)
    assert await db.fetchval(f"SELECT count(*) FROM \"{s}\".events WHERE event_type='fault.followup'") == 200
    twice = await db.fetchval(
        f'SELECT count(*) FROM (SELECT delivery_id FROM "{s}".transitions '
        "WHERE new_status = 'completed' GROUP BY 1 HAVING count(*) > 1) t"
    )
    assert twice == 0
