"""The one internal aiosqlite call the SQLite backend relies on still behaves as it needs."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import aiosqlite
import anyio
import pytest

from eventbus.backends.sqlite._link import Link, connection_thread, run_on_connection_thread
from eventbus.errors import BackendUnavailable


async def test_a_unit_runs_whole_on_the_connection_thread(tmp_path: Path) -> None:
    db = await aiosqlite.connect(str(tmp_path / "x.db"), isolation_level=None)
    try:
        seen: list[object] = []

        def unit(conn: sqlite3.Connection) -> int:
            seen.append(threading.current_thread())
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE t (x)")
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("COMMIT")
            return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])

        assert await run_on_connection_thread(db, unit) == 1
        assert seen[0] is not threading.main_thread()  # ran on aiosqlite's connection thread
        assert [tuple(r) for r in await db.execute_fetchall("SELECT x FROM t")] == [(1,)]
    finally:
        await db.close()


def test_the_connection_thread_is_found(tmp_path: Path) -> None:
    async def check() -> None:
        db = await aiosqlite.connect(str(tmp_path / "x.db"))
        try:
            assert connection_thread(db).is_alive()
        finally:
            await db.close()

    anyio.run(check)


def test_a_failed_open_leaves_no_thread_behind(tmp_path: Path) -> None:
    """The connection thread has ended when the open fails, before the event loop closes."""
    missing = str(tmp_path / "no-such-directory" / "x.db")
    for _ in range(20):
        with pytest.raises(BackendUnavailable, match="cannot open the SQLite database"):
            anyio.run(Link.open, missing, "FULL", 1000, 5.0)
        assert not [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]
