"""Stopping a worker: real processes, real signals, on both backends.

A first SIGTERM stops claiming at once, even in the middle of a backlog; a
second signal exits within about a second even when the database does not
answer; a handler that outlives the grace period counts an attempt, so a hung
handler reaches the dead-letter queue across restarts; a caller's
cancellation interrupts a public call blocked on the database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from eventbus import Envelope

from ..apps.lifecycle_events import Quick, Slow, Stuck
from ..conftest import Target
from ..support.pgserver import PgServer
from ..support.processes import EVENTBUS, Proc, ProcessGroup

APP = "tests.apps.lifecycle_app:bus"


class Db:
    """The test's own connection to the bus's tables, on either backend."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.pg: asyncpg.Connection | None = None
        self.path = target.dsn.removeprefix("sqlite:///")

    async def open(self) -> None:
        if self.target.kind == "postgres":
            self.pg = await asyncpg.connect(self.target.dsn)

    async def close(self) -> None:
        if self.pg is not None:
            await self.pg.close()

    def table(self, name: str) -> str:
        return f'"{self.target.schema}".{name}' if self.pg is not None else name

    async def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.pg is not None:
            return [tuple(r) for r in await self.pg.fetch(sql)]
        db = sqlite3.connect(self.path, timeout=30)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()

    async def value(self, sql: str) -> Any:
        return (await self.rows(sql))[0][0]

    async def counts(self) -> dict[str, int]:
        return dict(await self.rows(f"SELECT status, count(*) FROM {self.table('deliveries')} GROUP BY 1"))


@pytest.fixture
async def db(target: Target) -> AsyncIterator[Db]:
    bus = target.bus()
    try:
        await bus.migrate()
    finally:
        await bus.aclose()
    d = Db(target)
    await d.open()
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
def procs(tmp_path: Path) -> Any:
    group = ProcessGroup(tmp_path)
    try:
        yield group
    finally:
        group.close()


def worker(procs: ProcessGroup, target: Target, records: Path, *args: str, **env: str) -> Proc:
    records.mkdir(exist_ok=True)
    extra = {**target.env(), "LIFE_RECORDS": str(records), **env}
    return procs.spawn([EVENTBUS, "worker", APP, *args], extra, "worker")


def runs(records: Path) -> list[tuple[int, str, int, int]]:
    out = []
    for f in records.glob("*.runs"):
        for line in f.read_text().splitlines():
            pid, sub, delivery, attempt = line.split()
            out.append((int(pid), sub, int(delivery), int(attempt)))
    return out


async def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(0.02)
    return value


async def test_sigterm_stops_claiming_in_a_backlog(
    target: Target, db: Db, procs: ProcessGroup, tmp_path: Path
) -> None:
    total = 30_000
    async with target.bus() as bus:
        for start in range(0, total, 1_000):
            await bus.publish_many([Envelope(Quick(n=i)) for i in range(start, start + 1_000)])
    deliveries = db.table("deliveries")

    async def completed() -> int:
        n: int = await db.value(f"SELECT count(*) FROM {deliveries} WHERE status = 'completed'")
        return n

    w = worker(procs, target, tmp_path / "records", "--concurrency", "200", "--batch-size", "100")
    at_signal = await wait_for(lambda: _at_least(completed, 1_000), 60, "the worker to get going")
    w.signal(signal.SIGTERM)
    t0 = time.monotonic()
    rc = await w.wait_async(30)
    exit_seconds = time.monotonic() - t0
    assert rc == 0, w.output()
    counts = await db.counts()
    print(
        f"\n{target.kind}: SIGTERM at {at_signal} of {total} completed; "
        f"{counts}; exited in {exit_seconds:.2f}s"
    )
    assert counts.get("processing", 0) == 0, "claims left behind"
    assert counts.get("completed", 0) + counts.get("pending", 0) == total, counts
    assert counts["completed"] < total // 2, "the worker kept claiming after SIGTERM"
    # What was handed back was handed back without counting an attempt.
    recounted = await db.value(
        f"SELECT count(*) FROM {deliveries} WHERE status = 'pending' AND attempts <> 0"
    )
    assert recounted == 0


async def _at_least(count: Any, n: int) -> int:
    value: int = await count()
    return value if value >= n else 0


class Blocker:
    """Another connection that blocks the bus's writes: a table lock, or SQLite's write lock."""

    def __init__(self, target: Target, db: Db, table: str) -> None:
        self.target, self.db, self.table = target, db, table
        self.pg: asyncpg.Connection | None = None
        self.lite: sqlite3.Connection | None = None

    async def __aenter__(self) -> Blocker:
        if self.target.kind == "postgres":
            self.pg = await asyncpg.connect(self.target.dsn)
            await self.pg.execute("BEGIN")
            await self.pg.execute(f"LOCK TABLE {self.db.table(self.table)} IN ACCESS EXCLUSIVE MODE")
        else:
            self.lite = sqlite3.connect(self.db.path, isolation_level=None)
            self.lite.execute("BEGIN IMMEDIATE")
        return self

    async def release(self) -> None:
        if self.pg is not None:
            await self.pg.execute("ROLLBACK")
            await self.pg.close()
            self.pg = None
        if self.lite is not None:
            self.lite.execute("ROLLBACK")
            self.lite.close()
            self.lite = None

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


async def test_second_signal_exits_at_once_with_the_database_blocked(
    target: Target, db: Db, procs: ProcessGroup, tmp_path: Path
) -> None:
    async with target.bus() as bus:
        await bus.publish_many([Envelope(Slow(n=i)) for i in range(40)])
    records = tmp_path / "records"
    env = {"LIFE_SLOW_SECONDS": "1", "LIFE_LEASE": "3"}
    w = worker(procs, target, records, "--concurrency", "20", "--grace", "30", **env)
    await wait_for(lambda: _true(len(runs(records)) >= 20), 60, "handlers to start")
    async with Blocker(target, db, "deliveries"):
        await anyio.sleep(1.5)  # handlers end; their results, claims and heartbeats now wait
        w.signal(signal.SIGINT)
        await anyio.sleep(0.3)
        w.signal(signal.SIGINT)
        t0 = time.monotonic()
        rc = await w.wait_async(30)
        exit_seconds = time.monotonic() - t0
        print(f"\n{target.kind}: exited {exit_seconds:.2f}s after the second signal, database blocked")
        assert rc == 0, w.output()
        assert exit_seconds < 3, f"a second signal took {exit_seconds:.1f}s"
    # Nothing is lost: once the leases of what was left unwritten expire, a fresh worker finishes it.
    await anyio.sleep(3.5)
    drain = worker(procs, target, records, "--burst", **env)
    assert await drain.wait_async(60) == 0, drain.output()
    assert await db.counts() == {"completed": 40}


async def _true(value: bool) -> bool:
    return value


async def test_cancelled_publish_returns_with_the_database_blocked(target: Target, db: Db) -> None:
    bus = target.bus()
    async with bus:
        blocker = Blocker(target, db, "events")
        async with blocker, anyio.create_task_group() as tg:

            async def release_later() -> None:
                await anyio.sleep(8)  # only if the cancellation was ignored
                await blocker.release()

            tg.start_soon(release_later)
            t0 = time.monotonic()
            with anyio.move_on_after(0.5) as scope:
                await bus.publish(Quick(n=1), key="k1")
            elapsed = time.monotonic() - t0
            tg.cancel_scope.cancel()
        assert scope.cancelled_caught
        assert elapsed < 2, f"publish ignored its caller's cancellation for {elapsed:.1f}s"
        await anyio.sleep(0.5)  # an abandoned unit would have had the lock by now
        assert await db.value(f"SELECT count(*) FROM {db.table('events')}") == 0
        assert await db.value(f"SELECT count(*) FROM {db.table('deliveries')}") == 0
        result = await bus.publish(Quick(n=1), key="k1")
        assert not result.duplicate


async def test_a_hung_handler_reaches_the_dead_letter_queue_across_restarts(
    target: Target, db: Db, procs: ProcessGroup, tmp_path: Path
) -> None:
    async with target.bus() as bus:
        await bus.publish(Stuck(n=1))
    records = tmp_path / "records"
    deliveries, attempts = db.table("deliveries"), db.table("delivery_attempts")
    for restart in (1, 2):
        w = worker(procs, target, records, "--grace", "0.5", LIFE_MAX_ATTEMPTS="2")
        await wait_for(lambda n=restart: _true(len(runs(records)) >= n), 60, f"run {restart} to start")
        w.signal(signal.SIGTERM)
        assert await w.wait_async(20) == 0, w.output()
        status, count = (await db.rows(f"SELECT status, attempts FROM {deliveries}"))[0]
        assert (status, count) == ("pending" if restart == 1 else "dead", restart)
    errors = await db.rows(f"SELECT attempt, error_type FROM {attempts} ORDER BY attempt")
    assert errors == [(1, "HandlerInterrupted"), (2, "HandlerInterrupted")]


def _process_tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for c in children for p in _process_tree(int(c)))]


async def test_second_signal_exits_at_once_with_the_server_stopped(
    procs: ProcessGroup, tmp_path: Path
) -> None:
    """A server that does not answer at all (SIGSTOPped): nothing may wait on it, closing included."""
    server = PgServer().start()
    stopped: list[int] = []
    try:
        target = Target("postgres", server.dsn, "stopped")
        bus = target.bus()
        try:
            await bus.migrate()
            await bus.publish_many([Envelope(Slow(n=i)) for i in range(40)])
        finally:
            await bus.aclose()
        records = tmp_path / "records"
        w = worker(procs, target, records, "--concurrency", "20", "--grace", "30")
        await wait_for(lambda: _true(len(runs(records)) >= 20), 60, "handlers to start")
        master = int((server.data / "postmaster.pid").read_text().split()[0])
        stopped = _process_tree(master)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        await anyio.sleep(1.5)  # handlers end; their results, claims and heartbeats now wait
        w.signal(signal.SIGINT)
        await anyio.sleep(0.3)
        w.signal(signal.SIGINT)
        t0 = time.monotonic()
        rc = await w.wait_async(30)
        exit_seconds = time.monotonic() - t0
        print(f"\nexited {exit_seconds:.2f}s after the second signal, server SIGSTOPped")
        assert rc == 0, w.output()
        assert exit_seconds < 3, f"a second signal took {exit_seconds:.1f}s"
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        procs.close()
        server.destroy()
