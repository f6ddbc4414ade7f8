"""The ``-wal`` file stays bounded under sustained publishing and draining with a reader open.

For 12 s one process publishes 1 KiB ``sq.job`` events in batches of 100 as
fast as it can, two worker processes drain them (each job emits a follow-up),
and a reader connection in the test runs back-to-back read transactions (a
dashboard polling ``status``). The ``-wal`` file is sampled every 20 ms, until
the workers have completed 5,000 deliveries however long a busy machine makes
them take (each job emits a follow-up, so they drain on after the 12 s): it must
stay under 32 MiB (twice the size at which a commit triggers a TRUNCATE
checkpoint, half ``journal_size_limit``), so checkpoints keep up even though a
reader is nearly always in the file. Before the size trigger the WAL was only
truncated every 1,000 commits per process or at a worker's 5 s heartbeat and
reached 113 MiB in this test.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from ._support import Procs, integrity, prepare, scalar, status_counts, wait_until, worker_pids

SECONDS = 12.0
# The backend truncates the WAL once a commit finds it past 16 MiB
# (_CHECKPOINT_WAL_BYTES); allow one checkpoint's worth of growth on top.
WAL_BOUND = 32 * 1024 * 1024
LOAD = 5000  # events published and deliveries completed, for the load to mean anything


def _reader(db: Path, stop: threading.Event, reads: list[int]) -> None:
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        while not stop.is_set():
            conn.execute("BEGIN")
            conn.execute("SELECT status, count(*) FROM deliveries GROUP BY 1").fetchall()
            conn.execute("SELECT count(*) FROM events").fetchone()
            conn.execute("COMMIT")
            reads[0] += 1
            time.sleep(0.002)
    finally:
        conn.close()


def _sampler(wal: Path, stop: threading.Event, sizes: list[int]) -> None:
    while not stop.is_set():
        try:
            sizes.append(os.stat(wal).st_size)
        except FileNotFoundError:
            pass
        time.sleep(0.02)


def test_wal_stays_bounded_under_sustained_load_with_a_reader(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    wal = Path(f"{db}-wal")
    dsn = prepare(db)
    procs = Procs(dsn, tmp_path / "records", tmp_path)
    stop = threading.Event()
    reads = [0]
    reader = threading.Thread(target=_reader, args=(db, stop, reads), daemon=True)
    sizes: list[int] = []
    sampler = threading.Thread(target=_sampler, args=(wal, stop, sizes), daemon=True)
    try:
        workers = [
            procs.worker("--concurrency", "50", "--batch-size", "50", "--poll-interval", "1", name=f"w{i}")
            for i in range(2)
        ]
        wait_until(lambda: {w.pid for w in workers} <= worker_pids(db), 20, what="workers")
        reader.start()
        sampler.start()
        pub = procs.publisher(
            "--prefix",
            "p",
            "--count",
            "10000000",
            "--batch",
            "100",
            "--pad",
            "1024",
            "--seconds",
            str(SECONDS),
            name="pub",
        )
        assert pub.wait(SECONDS + 11) == 0, pub.output()
        wait_until(lambda: status_counts(db)["completed"] > LOAD, 60, 0.2, f"{LOAD} deliveries completed")
    finally:
        stop.set()
        for thread in (reader, sampler):
            if thread.is_alive():
                thread.join(10)
        procs.close()

    assert procs.bad_log_lines() == []
    assert integrity(db) == ["ok"]
    published = scalar(db, "SELECT count(*) FROM events WHERE event_type = 'sq.job'")
    counts = status_counts(db)
    mib = max(sizes) / 2**20
    print(
        f"\nsqlite WAL: max {mib:.1f} MiB over {len(sizes)} samples; {published} events "
        f"published in {SECONDS:.0f}s, {counts['completed']} deliveries completed, "
        f"{reads[0]} reader transactions"
    )
    assert published > LOAD and counts["completed"] > LOAD, "the load was too light to mean anything"
    assert reads[0] > 500
    assert max(sizes) < WAL_BOUND, f"WAL reached {mib:.1f} MiB"
