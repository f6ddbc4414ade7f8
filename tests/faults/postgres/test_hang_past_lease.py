"""A handler outlives its lease: the late completion is refused by the token.

Worker A claims a ``fault.hang`` delivery whose handler sleeps 4 s with a 2 s
lease; A is SIGSTOPped so its heartbeat stops renewing the lease. Worker B
recovers the expired lease, re-runs and completes the delivery. Then A gets
SIGCONT, its handler finishes and A tries to complete: the lease token no
longer matches, so the row stays as B left it and no second follow-up exists.
"""

from __future__ import annotations

import signal

from eventbus import Envelope

from ...apps.fault_events import Hang
from ._support import wait_until, worker_id_of


async def test_hang_past_lease_late_completion_is_rejected(fault_target, procs, db) -> None:
    s = fault_target.schema
    a = procs.worker("--poll-interval", "1", env={"FAULT_LEASE": "2", "FAULT_HANG_SECONDS": "4"}, name="a")
    a_id = await worker_id_of(db, s, a.pid)
    bus = fault_target.bus()
    async with bus:
        (published,) = await bus.publish_many([Envelope(Hang(n=1), key="h1")])

    async def a_started() -> bool:
        return bool(
            await db.fetchval(
                f"SELECT count(*) FROM \"{s}\".handler_runs WHERE pid = $1 AND phase = 'start'", a.pid
            )
        )

    await wait_until(a_started, 15, what="worker A to start the hanging handler")
    a.signal(signal.SIGSTOP)
    try:
        b = procs.worker(
            "--poll-interval", "1", env={"FAULT_LEASE": "2", "FAULT_HANG_SECONDS": "0.1"}, name="b"
        )
        b_id = await worker_id_of(db, s, b.pid)

        async def b_completed() -> object:
            return await db.fetchrow(
                f'SELECT d.* FROM "{s}".deliveries d JOIN "{s}".subscriptions s '
                "ON s.id = d.subscription_id WHERE s.name = 'hang' AND d.status = 'completed'"
            )

        row = await wait_until(b_completed, 20, what="worker B to complete the reclaimed delivery")
        assert row["worker_id"] == b_id and row["attempts"] == 2
    finally:
        a.signal(signal.SIGCONT)

    async def a_finished() -> bool:
        return bool(
            await db.fetchval(
                f"SELECT count(*) FROM \"{s}\".handler_runs WHERE pid = $1 AND phase = 'end'", a.pid
            )
        )

    await wait_until(a_finished, 10, what="worker A's handler to finish after SIGCONT")
    await wait_until(
        lambda: _async_true("stale completion" in a.output()),
        10,
        what="worker A to report its completion was refused",
    )

    after = await db.fetchrow(f'SELECT * FROM "{s}".deliveries WHERE id = $1', row["id"])
    assert after["status"] == "completed" and after["worker_id"] == b_id
    assert after["updated_at"] == row["updated_at"], "the late completion changed the row"
    completions = await db.fetchval(
        f"SELECT count(*) FROM \"{s}\".transitions WHERE delivery_id = $1 AND new_status = 'completed'",
        row["id"],
    )
    assert completions == 1
    runs = await db.fetch(
        f'SELECT pid, phase FROM "{s}".handler_runs WHERE delivery_id = $1 ORDER BY id', row["id"]
    )
    assert {(r["pid"], r["phase"]) for r in runs} == {
        (a.pid, "start"),
        (a.pid, "end"),
        (b.pid, "start"),
        (b.pid, "end"),
    }
    follow_ups = await db.fetch(
        f"SELECT id, causation_id FROM \"{s}\".events WHERE event_type = 'fault.followup'"
    )
    assert len(follow_ups) == 1 and follow_ups[0]["causation_id"] == published.event_id
    assert (
        await db.fetchval(
            f'SELECT count(*) FROM "{s}".delivery_attempts WHERE delivery_id = $1 '
            "AND error_type = 'LeaseExpired' AND worker_id = $2",
            row["id"],
            a_id,
        )
        == 1
    )


async def _async_true(value: bool) -> bool:
    return value
