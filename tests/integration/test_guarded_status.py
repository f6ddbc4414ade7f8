"""``move_status``: the guarded status move on the application's own tables, on each driver."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import asyncpg
import pytest

from eventbus import ConfigurationError
from eventbus.guarded import move_status

from ..conftest import Target

TABLE = "CREATE TABLE {t} (id integer PRIMARY KEY, status text NOT NULL, output text)"
ROWS = "INSERT INTO {t} (id, status) VALUES (1, 'pending'), (2, 'pending'), (3, 'pending')"


@pytest.fixture
async def pg(pg_target: Target) -> AsyncIterator[tuple[str, str]]:
    """A DSN and a ``schema.stages`` table with rows 1..3 pending."""
    table = f'"{pg_target.schema}".stages'
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{pg_target.schema}"')
        await conn.execute(TABLE.format(t=table))
        await conn.execute(
            f"INSERT INTO {table} (id, status) VALUES (1, 'pending'), (2, 'pending'), (3, 'pending')"
        )
    finally:
        await conn.close()
    yield pg_target.dsn, f"{pg_target.schema}.stages"


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute(TABLE.format(t="stages"))
        conn.execute(ROWS.format(t="stages"))
    return path


async def _pg_rows(conn: Any, table: str) -> list[tuple[int, str, str | None]]:
    schema, name = table.split(".")
    rows = await conn.fetch(f'SELECT id, status, output FROM "{schema}"."{name}" ORDER BY id')
    return [tuple(r) for r in rows]


def _sqlite_rows(path: Path) -> list[tuple[int, str, str | None]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT id, status, output FROM stages ORDER BY id").fetchall()


async def test_asyncpg_moves_only_from_the_expected_status(pg: tuple[str, str]) -> None:
    dsn, table = pg
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            assert await move_status(conn, table, 1, expect="pending", to="running")
            assert not await move_status(conn, table, 1, expect="pending", to="running"), "moved already"
            assert not await move_status(conn, table, 99, expect="pending", to="running"), "no such row"
        async with conn.transaction():
            moved = await move_status(
                conn, table, 1, expect=("running", "retrying"), to="done", also={"output": "ok"}
            )
            assert moved
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                assert await move_status(conn, table, 2, expect="pending", to="running")
                raise RuntimeError("the stage failed: its move rolls back with it")
        assert await _pg_rows(conn, table) == [(1, "done", "ok"), (2, "pending", None), (3, "pending", None)]
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        try:
            assert await move_status(pool, table, 3, expect="pending", to="skipped")
        finally:
            await pool.close()
        assert (await _pg_rows(conn, table))[2] == (3, "skipped", None)
    finally:
        await conn.close()


async def test_asyncpg_concurrent_moves_one_wins(pg: tuple[str, str]) -> None:
    dsn, table = pg
    conns = [await asyncpg.connect(dsn) for _ in range(4)]
    moved: list[bool] = []

    async def claim(conn: Any) -> None:
        async with conn.transaction():
            moved.append(await move_status(conn, table, 1, expect="pending", to="running"))
            await anyio.sleep(0.05)  # hold the row lock: the others wait, then see it moved

    try:
        async with anyio.create_task_group() as tg:
            for conn in conns:
                tg.start_soon(claim, conn)
        assert sorted(moved) == [False, False, False, True]
    finally:
        for conn in conns:
            await conn.close()


async def test_sqlite3_moves_in_the_callers_transaction(sqlite_file: Path) -> None:
    conn = sqlite3.connect(sqlite_file)
    try:
        assert await move_status(conn, "stages", 1, expect="pending", to="running")
        assert not await move_status(conn, "stages", 1, expect="pending", to="running")
        conn.rollback()
        assert await move_status(conn, "stages", 1, expect="pending", to="done", also={"output": "ok"})
        conn.commit()
    finally:
        conn.close()
    assert _sqlite_rows(sqlite_file)[0] == (1, "done", "ok")


async def test_aiosqlite_two_connections_one_wins(sqlite_file: Path) -> None:
    async with aiosqlite.connect(sqlite_file) as first, aiosqlite.connect(sqlite_file) as second:
        assert await move_status(first, "stages", 2, expect="pending", to="running")
        await first.commit()
        assert not await move_status(second, "stages", 2, expect="pending", to="running")
        assert await move_status(second, "stages", 2, expect="running", to="done", also={"output": "42"})
        await second.commit()
    assert _sqlite_rows(sqlite_file)[1] == (2, "done", "42")


@pytest.mark.parametrize(
    ("table", "options"),
    [
        ("stages; DROP TABLE stages", {}),
        ("a.b.c", {}),
        ("stages", {"column": 'status" = 1 --'}),
        ("stages", {"id_column": "1id"}),
        ("stages", {"also": {"out put": 1}}),
        ("stages", {"also": {"status": "x"}}),
        ("stages", {"expect": ()}),
    ],
)
async def test_bad_names_and_guards_are_refused_before_any_write(
    sqlite_file: Path, table: str, options: dict[str, Any]
) -> None:
    conn = sqlite3.connect(sqlite_file)
    try:
        with pytest.raises(ConfigurationError):
            await move_status(conn, table, 1, **{"expect": "pending", "to": "running", **options})
    finally:
        conn.close()
    assert _sqlite_rows(sqlite_file)[0] == (1, "pending", None)


async def test_another_kind_of_connection_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="asyncpg connection"):
        await move_status(object(), "stages", 1, expect="pending", to="running")
