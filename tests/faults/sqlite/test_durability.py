"""A publish acknowledged before a SIGKILL survives it (and so does its fan-out).

Two publisher processes (one event per publish, and batches of 20 through
``publish_many``) write to one file while a worker drains it; each prints a
line per event only after the publish returned. Each publisher is SIGKILLed at
a random moment, the first while it holds the write lock when it can be
caught there. Reopening the file: every acknowledged event is there with the
id it was acknowledged with, with its delivery; at most the one batch in
flight was committed without being acknowledged; integrity_check is ok. Run
with ``synchronous`` FULL and NORMAL, set through the DSN (NORMAL may lose the
last commits on power loss, never on a process crash).
"""

from __future__ import annotations

import functools
import random
import time
from pathlib import Path

import pytest

from ...support.processes import Proc
from ._support import (
    Procs,
    acks,
    integrity,
    prepare,
    rows,
    scalar,
    wait_until,
    worker_pids,
    write_lock_holder,
)

ENOUGH = 20


def _acked_past(proc: Proc, n: int) -> bool:
    return len(acks(proc)) > n


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_acknowledged_publishes_survive_sigkill(tmp_path: Path, synchronous: str) -> None:
    db = tmp_path / "bus.db"
    dsn = f"{prepare(db)}?synchronous={synchronous}"
    procs = Procs(dsn, tmp_path / "records", tmp_path)
    rng = random.Random()
    try:
        w = procs.worker("--concurrency", "20", "--poll-interval", "1", name="w")
        wait_until(lambda: w.pid in worker_pids(db), 20, what="the worker to start")
        single = procs.publisher("--prefix", "s", "--count", "1000000", "--audits", "0.2", name="single")
        batched = procs.publisher(
            "--prefix", "b", "--count", "1000000", "--batch", "20", "--audits", "0.2", name="batched"
        )
        for p in (single, batched):  # enough acknowledged that a kill has something to lose
            wait_until(
                functools.partial(_acked_past, p, ENOUGH), 20, what=f"{p.name} to publish {ENOUGH} events"
            )
        time.sleep(rng.uniform(0.3, 1.0))
        deadline = time.monotonic() + 1.0
        while write_lock_holder(Path(f"{db}-shm")) != single.pid and time.monotonic() < deadline:
            time.sleep(0.0005)
        single.kill()
        time.sleep(rng.uniform(0.05, 0.5))
        batched.kill()
        w.kill()
    finally:
        procs.close()

    assert integrity(db) == ["ok"]
    assert procs.bad_log_lines() == []
    assert scalar(db, "PRAGMA journal_mode") == "wal"
    for p, batch in ((single, 1), (batched, 20)):
        acked = acks(p)
        assert len(acked) > ENOUGH, f"{p.name} acknowledged only {len(acked)} events"
        stored = {
            key: (event_id, event_type)
            for key, event_id, event_type in rows(
                db, "SELECT key, id, event_type FROM events WHERE key LIKE ?", (f"{p.name[0]}-%",)
            )
        }
        lost = [(key, event_id) for _t, key, event_id in acked if stored.get(key, (None,))[0] != event_id]
        assert lost == [], f"{p.name}: {len(lost)} acknowledged events lost, e.g. {lost[:3]}"
        assert all(stored[key][1] == f"sq.{t.lower()}" for t, key, _i in acked)
        # Only the publish in flight at the kill may have committed unacknowledged.
        assert len(stored) - len(acked) <= batch, (p.name, len(stored), len(acked))
        print(
            f"\n{synchronous} {p.name}: {len(acked)} acknowledged, "
            f"{len(stored) - len(acked)} committed but not acknowledged, 0 lost"
        )
    # Fan-out is part of the publish: every stored event has its delivery.
    assert (
        scalar(
            db,
            "SELECT count(*) FROM events e WHERE e.event_type IN ('sq.job', 'sq.audit') "
            "AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id)",
        )
        == 0
    )
