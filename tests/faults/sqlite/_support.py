"""Helpers of the SQLite fault tests: real files, real worker processes, real signals.

Every process is started through :class:`Procs`, which each test closes in a
``finally`` block: SIGCONT + SIGTERM, then SIGKILL after a short wait, and
only for the processes it started (by pid).
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from eventbus import Bus

from ...support.processes import EVENTBUS, Proc, ProcessGroup

APP = "tests.apps.sqlite_app:bus"

# What must never reach a log: lock errors, tracebacks, failed database calls.
BAD_LOG = re.compile(
    r"database is locked|database table is locked|stayed locked|is busy|Traceback|"
    r"claiming failed|could not write|housekeeping failed|lease renewal failed|"
    r"SQLite refused|polling .* failed|gave up",
    re.IGNORECASE,
)


def prepare(path: Path) -> str:
    """Migrate a new bus file; add ``transitions``, written by a trigger on every status change.

    ``old_token`` is the lease token the row held before the change, so a
    completion names the claim it completed.
    """
    dsn = f"sqlite:///{path}"
    asyncio.run(_migrate(dsn))
    with connect(path) as db:
        db.executescript("""
            CREATE TABLE transitions (
                id INTEGER PRIMARY KEY, delivery_id INTEGER NOT NULL, old_status TEXT,
                new_status TEXT NOT NULL, worker_id TEXT, old_token TEXT, attempts INTEGER,
                at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0));
            CREATE TRIGGER deliveries_transitions AFTER UPDATE OF status ON deliveries
            FOR EACH ROW WHEN OLD.status IS NOT NEW.status BEGIN
                INSERT INTO transitions (delivery_id, old_status, new_status, worker_id,
                                         old_token, attempts)
                VALUES (NEW.id, OLD.status, NEW.status, NEW.worker_id, OLD.lease_token,
                        NEW.attempts);
            END;
        """)
    return dsn


async def _migrate(dsn: str) -> None:
    bus = Bus(dsn)
    try:
        await bus.migrate()
    finally:
        await bus.aclose()


@contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A short-lived connection of the test itself (autocommit, waits on locks)."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        yield db
    finally:
        db.close()


def scalar(path: Path, sql: str, params: Any = ()) -> Any:
    with connect(path) as db:
        return db.execute(sql, params).fetchone()[0]


def rows(path: Path, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with connect(path) as db:
        return db.execute(sql, params).fetchall()


def integrity(path: Path) -> list[str]:
    return [r[0] for r in rows(path, "PRAGMA integrity_check")]


def status_counts(path: Path) -> Counter[str]:
    return Counter(dict(rows(path, "SELECT status, count(*) FROM deliveries GROUP BY 1")))


def settled(path: Path) -> bool:
    return scalar(path, "SELECT count(*) FROM deliveries WHERE status IN ('pending', 'processing')") == 0


def drained(path: Path, what: str, stall: float = 15.0) -> None:
    """Until no delivery is pending or processing; fails once none has ended for ``stall`` seconds.

    Judged by progress, not by a deadline: a busy machine drains slower, a stuck
    delivery (a lease never recovered, a claim never released) stops the count.
    Progress is a delivery reaching an end (completed, dead or cancelled), not
    the unfinished count going down: a completion that publishes follow-ups or
    starts runs adds as many unfinished deliveries as it ends, or more.
    """
    ended, since = -1, time.monotonic()
    while True:
        ((left, now_ended),) = rows(
            path,
            "SELECT count(*) FILTER (WHERE status IN ('pending', 'processing')), "
            "count(*) FILTER (WHERE status NOT IN ('pending', 'processing')) FROM deliveries",
        )
        if not left:
            return
        if now_ended > ended:
            ended, since = now_ended, time.monotonic()
        if time.monotonic() - since > stall:
            left_by = rows(
                path,
                "SELECT s.name, d.status, count(*) FROM deliveries d JOIN subscriptions s "
                "ON s.id = d.subscription_id WHERE d.status IN ('pending', 'processing') GROUP BY 1, 2",
            )
            raise AssertionError(f"{what}: no delivery ended for {stall:.0f}s, {left} left: {left_by}")
        time.sleep(0.2)


class Run(NamedTuple):
    pid: int
    phase: str
    subscription: str
    delivery_id: int
    event_id: int
    attempt: int
    detail: str


def handler_runs(records: Path) -> list[Run]:
    """Every line the app's handlers recorded, from every process."""
    runs = []
    for f in sorted(records.glob("*.runs")):
        for line in f.read_text().splitlines():
            pid, phase, sub, did, eid, attempt, *detail = line.split(" ")
            runs.append(Run(int(pid), phase, sub, int(did), int(eid), int(attempt), " ".join(detail)))
    return runs


def wait_until(
    check: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Procs(ProcessGroup):
    """The processes one test started, on one SQLite file."""

    def __init__(self, dsn: str, records: Path, logdir: Path) -> None:
        super().__init__(logdir)
        self.dsn = dsn
        self.records = records
        records.mkdir(exist_ok=True)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        own = {"EVENTBUS_DSN": self.dsn, "SQ_RECORDS": str(self.records)}
        return super().env({**own, **(extra or {})})

    def worker(self, *args: str, env: dict[str, str] | None = None, name: str = "w") -> Proc:
        return self.spawn([EVENTBUS, "worker", APP, *args], env, name)

    def publisher(self, *args: str, env: dict[str, str] | None = None, name: str = "pub") -> Proc:
        """``tests.apps.sqlite_publisher``; its stdout (the acks) goes to ``<log>.out``."""
        return self.spawn(
            [sys.executable, "-m", "tests.apps.sqlite_publisher", *args], env, name, split_stdout=True
        )

    def bad_log_lines(self) -> list[str]:
        return [
            f"{p.name}[{p.pid}]: {line}"
            for p in self.all
            for line in p.output().splitlines()
            if BAD_LOG.search(line)
        ]


def acks(proc: Proc) -> list[tuple[str, str, int]]:
    """(event type, key, event id) of every publish the publisher saw acknowledged."""
    out = []
    for line in proc.log.with_suffix(".out").read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 4 and parts[0] == "ack":  # a torn last line was never acknowledged
            out.append((parts[1], parts[2], int(parts[3])))
    return out


def worker_pids(path: Path) -> set[int]:
    """Pids of workers that wrote their first heartbeat (registered and running)."""
    try:
        return {r[0] for r in rows(path, "SELECT pid FROM workers")}
    except sqlite3.OperationalError:
        return set()


def write_lock_holder(shm: Path) -> int | None:
    """Pid holding the WAL write lock of a database (byte 120 of its ``-shm``), from /proc/locks."""
    try:
        inode = os.stat(shm).st_ino
    except FileNotFoundError:
        return None
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120"
        if len(fields) >= 8 and fields[1] == "POSIX" and fields[3] == "WRITE":
            if int(fields[5].rsplit(":", 1)[1]) == inode and fields[6] == "120":
                return int(fields[4])
    return None
