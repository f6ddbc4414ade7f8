"""The soaks' progress check: a delivery reaching an end is progress, whatever the backlog does.

A transactional soak's handler completes one delivery and publishes a follow-up
and a run start with it: the unfinished count stays flat or grows while work
goes on, and a check judging by that count reported a stall that was not one.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from ._support import drained


def _file(path: Path, pending: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE subscriptions (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("CREATE TABLE deliveries (id INTEGER PRIMARY KEY, subscription_id INTEGER, status TEXT)")
        conn.execute("INSERT INTO subscriptions VALUES (1, 'job')")
        conn.executemany(
            "INSERT INTO deliveries (subscription_id, status) VALUES (1, ?)", [("pending",)] * pending
        )


def _work(path: Path, steps: int) -> None:
    """Each step ends one delivery and adds two (a follow-up and a run's step); then the rest end."""
    with sqlite3.connect(path, isolation_level=None) as conn:
        for _ in range(steps):
            conn.execute(
                "UPDATE deliveries SET status = 'completed' WHERE id = "
                "(SELECT min(id) FROM deliveries WHERE status = 'pending')"
            )
            conn.execute(
                "INSERT INTO deliveries (subscription_id, status) VALUES (1, 'pending'), (1, 'pending')"
            )
            time.sleep(0.02)
        conn.execute("UPDATE deliveries SET status = 'completed'")


def test_a_growing_backlog_that_keeps_ending_deliveries_is_progress(tmp_path: Path) -> None:
    path = tmp_path / "bus.db"
    _file(path, 10)
    worker = threading.Thread(target=_work, args=(path, 60))  # about 1.2 s of a growing backlog
    worker.start()
    try:
        drained(path, "growing backlog", stall=0.6)
    finally:
        worker.join()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM deliveries WHERE status = 'completed'").fetchone()[0] == 130


def test_nothing_ending_is_a_stall(tmp_path: Path) -> None:
    path = tmp_path / "bus.db"
    _file(path, 3)
    with pytest.raises(
        AssertionError, match=r"no delivery ended for 0s, 3 left: \[\('job', 'pending', 3\)\]"
    ):
        drained(path, "stuck", stall=0.3)
