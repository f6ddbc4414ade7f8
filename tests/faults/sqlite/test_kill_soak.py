"""Kill soak on one SQLite file: 4 worker processes, one SIGKILLed again and again.

Workload: 3,000 ``sq.job`` (each emits one keyed ``sq.followup``) and 600
``sq.audit`` events (each handler publishes one keyed ``sq.note`` through the
bus) published up front, plus 1,000 more published one at a time by a second
process *during* the kills: 9,200 deliveries. 4 workers with a 2 s lease; worker
0 is SIGKILLed 8 times, each time at a moment it holds the file's write lock
(seen in /proc/locks: byte 120 of the ``-shm`` file; a random moment when it
does not take the lock within 1 s), and restarted.

Afterwards: no ``database is locked`` (or any other database error) reached a
worker's log, the publisher or a handler; every delivery completed (or, out
of attempts after kills, is dead with its error) exactly once, by the claim
whose handler recorded its end; nothing lost; one follow-up per job;
``PRAGMA integrity_check`` is ok.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

from eventbus import Bus, Envelope

from ...apps.sqlite_events import Audit, Job
from ._support import (
    Procs,
    acks,
    drained,
    handler_runs,
    integrity,
    prepare,
    rows,
    scalar,
    status_counts,
    wait_until,
    worker_pids,
    write_lock_holder,
)

JOBS, AUDITS, LATE = 3000, 600, 1000
KILLS = 8
WORKER_ARGS = ("--concurrency", "10", "--batch-size", "10", "--poll-interval", "1", "--grace", "1")
WORKER_ENV = {"SQ_LEASE": "2", "SQ_SLEEP": "0.05"}


async def _publish_up_front(dsn: str) -> None:
    events = [Envelope(Job(n=i), key=f"j{i}") for i in range(JOBS)]
    events += [Envelope(Audit(n=i), key=f"a{i}") for i in range(AUDITS)]
    random.Random(7).shuffle(events)
    async with Bus(dsn) as bus:
        for i in range(0, len(events), 500):
            results = await bus.publish_many(events[i : i + 500])
            assert not any(r.duplicate for r in results)


def _kill_during_write(procs: Procs, victim, shm: Path, rng: random.Random) -> bool:
    """SIGKILL ``victim`` while it holds the write lock if possible; True when it did."""
    time.sleep(rng.uniform(0.1, 0.5))
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        if write_lock_holder(shm) == victim.pid:
            victim.kill()
            return True
        time.sleep(0.0005)
    victim.kill()
    return False


def _publisher_done(pub, stall: float = 10.0) -> int:
    """The publisher's exit code; fails if it goes ``stall`` seconds without acknowledging a publish."""
    seen, since = -1, time.monotonic()
    while (rc := pub.wait(0.2)) is None:
        n = len(acks(pub))
        if n != seen:
            seen, since = n, time.monotonic()
        assert time.monotonic() - since < stall, f"the publisher stalled at {n} acknowledged events"
    return rc


def test_kill_soak_four_workers_one_file(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    shm = Path(f"{db}-shm")
    dsn = prepare(db)
    procs = Procs(dsn, tmp_path / "records", tmp_path)
    rng = random.Random(20240611)
    try:
        workers = [procs.worker(*WORKER_ARGS, env=WORKER_ENV, name=f"w{i}") for i in range(4)]
        wait_until(lambda: {w.pid for w in workers} <= worker_pids(db), 30, what="4 workers to start")
        asyncio.run(_publish_up_front(dsn))
        late = procs.publisher(
            "--prefix", "late", "--count", str(LATE), "--audits", "0.25", "--pace", "0.004", name="pub"
        )
        started = time.monotonic()
        in_lock = 0
        for _ in range(KILLS):
            in_lock += _kill_during_write(procs, workers[0], shm, rng)
            workers[0] = procs.worker(*WORKER_ARGS, env=WORKER_ENV, name="w0")
            wait_until(lambda: workers[0].pid in worker_pids(db), 20, what="the restarted worker to start")
        left = scalar(db, "SELECT count(*) FROM deliveries WHERE status IN ('pending', 'processing')")
        assert left, "the workload drained before the last kill: make it longer"
        assert _publisher_done(late) == 0, late.output()
        drained(db, "the soak")
        elapsed = time.monotonic() - started
    finally:
        procs.close()

    assert procs.bad_log_lines() == []
    assert integrity(db) == ["ok"]
    late_acks = acks(late)
    assert len(late_acks) == LATE
    late_audits = sum(1 for t, _k, _i in late_acks if t == "Audit")
    jobs, audits = JOBS + LATE - late_audits, AUDITS + late_audits

    # Nothing lost: every event and delivery is there, and each one ended.
    per_sub = dict(
        rows(
            db,
            "SELECT s.name, count(*) FROM deliveries d "
            "JOIN subscriptions s ON s.id = d.subscription_id GROUP BY 1",
        )
    )
    assert per_sub == {"job": jobs, "followup": jobs, "audit": audits, "note": audits}, per_sub
    assert scalar(db, "SELECT count(*) FROM events") == 2 * (jobs + audits)
    counts = status_counts(db)
    assert set(counts) <= {"completed", "dead"}, counts
    assert (
        scalar(db, "SELECT count(*) FROM deliveries WHERE status = 'dead' AND coalesce(last_error, '') = ''")
        == 0
    )
    for _type, key, event_id in late_acks:  # acknowledged under kills: stored as acked
        assert scalar(db, "SELECT id FROM events WHERE key = ?", (key,)) == event_id, key

    # One follow-up per job (emitted: caused by it) and one note per audit
    # (published by its handler), found by key.
    for parent, child, prefix in (("sq.job", "sq.followup", "f:"), ("sq.audit", "sq.note", "n:")):
        orphans = scalar(
            db,
            "SELECT count(*) FROM events p WHERE p.event_type = ? AND NOT EXISTS "
            "(SELECT 1 FROM events c WHERE c.event_type = ? AND c.key = ? || p.key)",
            (parent, child, prefix),
        )
        assert orphans == 0, (parent, orphans)
    assert (
        scalar(
            db,
            "SELECT count(*) FROM events f JOIN events j ON j.id = f.causation_id "
            "WHERE f.event_type = 'sq.followup' AND f.key = 'f:' || j.key",
        )
        == jobs
    )

    # Exactly once: one transition to completed per completed delivery, and the
    # completing claim's handler recorded its end.
    assert (
        scalar(
            db,
            "SELECT count(*) FROM (SELECT delivery_id FROM transitions "
            "WHERE new_status = 'completed' GROUP BY 1 HAVING count(*) <> 1)",
        )
        == 0
    )
    completed = dict(rows(db, "SELECT id, attempts FROM deliveries WHERE status = 'completed'"))
    assert scalar(db, "SELECT count(*) FROM transitions WHERE new_status = 'completed'") == len(completed)
    runs = handler_runs(tmp_path / "records")
    errors = [r for r in runs if r.phase == "error"]
    assert errors == [], errors[:5]
    ended = {(r.delivery_id, r.attempt) for r in runs if r.phase == "end"}
    missing = [d for d, attempt in completed.items() if (d, attempt) not in ended]
    assert missing == [], f"{len(missing)} completed deliveries without a handler end"
    reruns = Counter(r.delivery_id for r in runs if r.phase == "start")
    orphaned = scalar(
        db, "SELECT count(*) FROM delivery_attempts WHERE error_type IN ('LeaseExpired', 'WorkerLost')"
    )
    assert orphaned > 0, "no kill left a claimed delivery behind"
    print(
        f"\nsqlite kill soak: {KILLS} SIGKILLs ({in_lock} while holding the write lock), "
        f"{orphaned} orphaned leases recovered, {counts['dead']} dead, "
        f"{sum(1 for n in reruns.values() if n > 1)} handlers re-run; "
        f"{sum(counts.values())} deliveries in {elapsed:.1f}s, {left} left after the last kill"
    )
