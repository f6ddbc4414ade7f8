"""The one internal aiosqlite call the SQLite backend relies on still behaves as it needs."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import aiosqlite

from eventbus.backends.sqlite._link import run_on_connection_thread


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
