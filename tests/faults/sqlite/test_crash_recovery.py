"""A worker SIGKILLed between claim and completion: another worker takes it back and finishes.

Worker A claims a ``sq.hang`` delivery whose handler blocks for 60 s (lease
1.5 s, renewed by A's heartbeat while A lives); worker B runs beside it. A is
SIGKILLed while its handler is blocked. B takes the delivery back, by its
rescue (A's process is gone from this host) or by the lease running out,
whichever of its passes (every second) comes first, re-runs the handler and
completes the delivery: exactly once, attempt 2, one follow-up, A's lost
attempt kept in the history as ``WorkerLost`` or ``LeaseExpired``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from eventbus import Bus

from ...apps.sqlite_events import Hang
from ._support import Procs, handler_runs, integrity, prepare, rows, scalar, wait_until, worker_pids

LEASE = 1.5
RECOVERY_SWEEP = 1.0  # Worker.recovery_interval_seconds, the default of --recovery-interval


async def _publish(dsn: str) -> int:
    async with Bus(dsn) as bus:
        return int((await bus.publish(Hang(n=1), key="h1")).event_id)


def test_sigkill_while_handler_blocked_is_recovered_after_the_lease(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    dsn = prepare(db)
    records = tmp_path / "records"
    procs = Procs(dsn, records, tmp_path)
    try:
        a = procs.worker(
            "--poll-interval", "1", env={"SQ_LEASE": str(LEASE), "SQ_HANG_SECONDS": "60"}, name="a"
        )
        wait_until(lambda: a.pid in worker_pids(db), 20, what="worker A to start")
        event_id = asyncio.run(_publish(dsn))
        wait_until(
            lambda: any(r.pid == a.pid and r.phase == "start" for r in handler_runs(records)),
            10,
            what="worker A to start the blocking handler",
        )
        b = procs.worker(
            "--poll-interval", "1", env={"SQ_LEASE": str(LEASE), "SQ_HANG_SECONDS": "0.05"}, name="b"
        )
        wait_until(lambda: b.pid in worker_pids(db), 20, what="worker B to start")
        # A's heartbeat keeps its lease: B must not take the delivery while A lives.
        time.sleep(2 * LEASE)
        assert scalar(db, "SELECT status FROM deliveries") == "processing"
        a_worker = scalar(db, "SELECT worker_id FROM deliveries")
        killed_at = time.monotonic()
        a.kill()
        wait_until(
            lambda: scalar(db, "SELECT status FROM deliveries") == "completed",
            LEASE + RECOVERY_SWEEP + 5,
            what="worker B to complete the orphaned delivery",
        )
        recovered_in = time.monotonic() - killed_at
        time.sleep(0.5)  # nothing else may happen afterwards
    finally:
        procs.close()

    assert procs.bad_log_lines() == []
    assert integrity(db) == ["ok"]
    ((delivery_id, status, attempts, worker),) = rows(
        db,
        "SELECT id, status, attempts, worker_id FROM deliveries d "
        "WHERE d.subscription_id = (SELECT id FROM subscriptions WHERE name = 'hang')",
    )
    assert (status, attempts) == ("completed", 2)
    assert worker != a_worker
    assert rows(
        db, "SELECT new_status FROM transitions WHERE delivery_id = ? ORDER BY id", (delivery_id,)
    ) == [("processing",), ("pending",), ("processing",), ("completed",)]
    ((attempt, error_type, by),) = rows(
        db,
        "SELECT attempt, error_type, worker_id FROM delivery_attempts WHERE delivery_id = ?",
        (delivery_id,),
    )
    assert (attempt, by) == (1, a_worker) and error_type in ("WorkerLost", "LeaseExpired")
    runs = [(r.pid, r.phase, r.attempt) for r in handler_runs(records) if r.delivery_id == delivery_id]
    assert sorted(runs) == sorted([(a.pid, "start", 1), (b.pid, "start", 2), (b.pid, "end", 2)])
    assert rows(db, "SELECT causation_id FROM events WHERE event_type = 'sq.followup'") == [(event_id,)]
    print(
        f"\nsqlite crash recovery: SIGKILL to completion by another worker in {recovered_in:.1f}s "
        f"(lease {LEASE}s, recovery sweep every {RECOVERY_SWEEP}s)"
    )
