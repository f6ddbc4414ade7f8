"""Kill soak of a transactional handler and a transactional state on one SQLite file.

1,200 ``txn.job`` events (EVENTBUS_SOAK_JOBS); the transactional handler inserts one row into the
application's table ``app_rows`` (no unique constraint) through
``ctx.connection``, inside the write transaction that completes its
delivery, emits one follow-up without a key and starts a run of a state
machine whose transactional state inserts one row into ``wf_rows`` with its
transition. 3 worker processes with a 2 s lease; a random one is SIGKILLed
8 times (EVENTBUS_SOAK_KILLS) at random moments and restarted. Afterwards: exactly one
application row, one follow-up and one completed run with one ``wf_rows``
row per job, every delivery completed, no lock error in any log,
``PRAGMA integrity_check`` ok.

Beside it: a worker SIGKILLed while its handler holds the write transaction
open leaves nothing behind, and a handler timeout past what other writers
wait for the lock is refused.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from eventbus import Bus, Context, Envelope, RetryPolicy

from ...apps.txn_events import TxnJob
from ...support.helpers import drain
from ...support.processes import EVENTBUS
from ._support import (
    Procs,
    connect,
    drained,
    integrity,
    prepare,
    rows,
    scalar,
    settled,
    wait_until,
    worker_pids,
)

# The suite's size; the full size on demand: EVENTBUS_SOAK_JOBS=5000 EVENTBUS_SOAK_KILLS=20.
JOBS = int(os.environ.get("EVENTBUS_SOAK_JOBS", 1200))
WORKERS = 3
KILLS = int(os.environ.get("EVENTBUS_SOAK_KILLS", 8))
WORKER_ARGS = ("--concurrency", "5", "--batch-size", "5", "--poll-interval", "1", "--grace", "1")
WORKER_ENV = {"TXN_LEASE": "2", "TXN_SLEEP": "0.002"}
APP = "tests.apps.txn_app:bus"


async def _publish(dsn: str) -> None:
    async with Bus(dsn) as bus:
        events = [Envelope(TxnJob(n=i), key=f"j{i}") for i in range(JOBS)]
        for i in range(0, JOBS, 500):
            results = await bus.publish_many(events[i : i + 500])
            assert not any(r.duplicate for r in results)


async def test_a_timeout_past_the_write_lock_bound_is_refused(tmp_path: Path) -> None:
    """Other writers wait busy_timeout_ms x 4 (here 8 s) for the lock: a handler may hold it 4 s."""
    async with Bus(f"sqlite:///{tmp_path / 'bus.db'}", busy_timeout_ms=2000, migrate=True) as bus:
        ran: list[float] = []

        @bus.subscribe(TxnJob, name="short", transactional=True, timeout_seconds=4)
        async def short(event: TxnJob, ctx: Context) -> None:
            ran.append(4)

        @bus.subscribe(
            TxnJob, name="long", transactional=True, timeout_seconds=5, retry=RetryPolicy(max_attempts=1)
        )
        async def long(event: TxnJob, ctx: Context) -> None:
            ran.append(5)

        await bus.register()
        await bus.publish(TxnJob(n=1))
        await drain(bus)
        assert ran == [4]
        (dead,) = await bus.dead_letters()
        detail = await bus.delivery(dead.id)
        assert detail.subscription == "long"
        assert detail.history[0].error_type == "ConfigurationError"
        assert "at most 4s" in detail.history[0].message


def _check(db: Path) -> None:
    assert set(dict(rows(db, "SELECT status, count(*) FROM deliveries GROUP BY 1"))) == {"completed"}
    # One run of the machine per job, completed, and one row of its transactional state each.
    assert rows(db, "SELECT status, run_id, count(*) FROM wf_instances GROUP BY 1, 2") == [
        ("completed", 1, JOBS)
    ]
    assert scalar(db, "SELECT count(*) FROM wf_rows") == JOBS
    assert scalar(db, "SELECT count(DISTINCT n) FROM wf_rows") == JOBS
    assert scalar(db, "SELECT count(*) FROM app_rows") == JOBS
    assert scalar(db, "SELECT count(DISTINCT n) FROM app_rows") == JOBS
    per_job = rows(
        db,
        "SELECT j.id, count(f.id) FROM events j LEFT JOIN events f "
        "ON f.causation_id = j.id AND f.event_type = 'txn.followup' "
        "WHERE j.event_type = 'txn.job' GROUP BY j.id",
    )
    assert len(per_job) == JOBS and {n for _id, n in per_job} == {1}
    # Each row was written by the run that completed the delivery.
    assert (
        scalar(
            db,
            "SELECT count(*) FROM app_rows r JOIN deliveries d ON d.event_id = r.event_id "
            "JOIN subscriptions s ON s.id = d.subscription_id AND s.name = 'txn' "
            "WHERE d.attempts <> r.attempt",
        )
        == 0
    )


def test_kill_soak_transactional_handler(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    dsn = prepare(db)
    with connect(db) as conn:
        conn.execute(
            "CREATE TABLE app_rows (event_id INTEGER NOT NULL, n INTEGER NOT NULL, "
            "pid INTEGER NOT NULL, attempt INTEGER NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE wf_rows (n INTEGER NOT NULL, version INTEGER NOT NULL, pid INTEGER NOT NULL)"
        )
    procs = Procs(dsn, tmp_path / "records", tmp_path)
    rng = random.Random(20261202)

    def worker(i: int):
        return procs.spawn([EVENTBUS, "worker", APP, *WORKER_ARGS], procs.env(WORKER_ENV), f"w{i}")

    try:
        workers = [worker(i) for i in range(WORKERS)]
        wait_until(lambda: {w.pid for w in workers} <= worker_pids(db), 30, what="the workers to start")
        started = time.monotonic()
        asyncio.run(_publish(dsn))
        kills = 0
        while kills < KILLS and not settled(db):
            time.sleep(rng.uniform(0.3, 0.8))
            i = rng.randrange(WORKERS)
            workers[i].kill()
            kills += 1
            workers[i] = worker(i)
        assert kills == KILLS, f"the workload drained after {kills} kills: make it longer"
        drained(db, "transactional soak")
        elapsed = time.monotonic() - started
    finally:
        procs.close()
    assert procs.bad_log_lines() == []
    assert integrity(db) == ["ok"]
    _check(db)
    orphaned = scalar(
        db, "SELECT count(*) FROM delivery_attempts WHERE error_type IN ('LeaseExpired', 'WorkerLost')"
    )
    assert orphaned > 0, "no kill left a claimed delivery behind"
    print(
        f"\ntransactional kill soak (sqlite): {KILLS} SIGKILLs, {orphaned} orphaned leases; "
        f"{scalar(db, 'SELECT count(*) FROM deliveries')} deliveries in {elapsed:.1f}s"
    )


def test_sigkill_inside_the_write_transaction_leaves_no_writes(tmp_path: Path) -> None:
    """A worker killed while its handler holds the write transaction open (it inserted its row and
    waits): the file keeps nothing of it, the lock is free, and the next run writes the only row."""
    db = tmp_path / "bus.db"
    dsn = prepare(db)
    with connect(db) as conn:
        conn.execute(
            "CREATE TABLE app_rows (event_id INTEGER NOT NULL, n INTEGER NOT NULL, "
            "pid INTEGER NOT NULL, attempt INTEGER NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE wf_rows (n INTEGER NOT NULL, version INTEGER NOT NULL, pid INTEGER NOT NULL)"
        )
    procs = Procs(dsn, tmp_path / "records", tmp_path)
    try:
        slow = procs.spawn([EVENTBUS, "worker", APP, *WORKER_ARGS], procs.env({"TXN_SLEEP": "5"}), "slow")
        wait_until(lambda: slow.pid in worker_pids(db), 30, what="the slow worker to start")
        asyncio.run(_publish_some(dsn, 3))
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM deliveries WHERE status = 'processing'"),
            20,
            what="a claim",
        )
        time.sleep(0.5)  # the first handler has inserted its row and waits inside its transaction
        slow.kill()
        assert scalar(db, "SELECT count(*) FROM app_rows") == 0
        procs.spawn([EVENTBUS, "worker", APP, *WORKER_ARGS], procs.env(WORKER_ENV), "fast")
        drained(db, "after the kill", stall=30)
    finally:
        procs.close()
    assert integrity(db) == ["ok"]
    assert scalar(db, "SELECT count(*) FROM app_rows") == 3
    assert set(dict(rows(db, "SELECT status, count(*) FROM deliveries GROUP BY 1"))) == {"completed"}


async def _publish_some(dsn: str, n: int) -> None:
    async with Bus(dsn) as bus:
        await bus.publish_many([Envelope(TxnJob(n=i), key=f"j{i}") for i in range(n)])
