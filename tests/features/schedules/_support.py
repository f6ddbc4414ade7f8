"""SQL the schedule tests use to look behind the API, on either backend."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import Any

import asyncpg

from ...conftest import Target

__all__ = ["db_now", "event_keys", "rewind", "sqlite_path", "store_rows"]


def sqlite_path(target: Target) -> str:
    return target.dsn.removeprefix("sqlite:///")


async def _pg(target: Target, query: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(f'SET search_path TO "{target.schema}"')
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


def _sqlite(target: Target, query: str, *args: Any) -> list[Any]:
    conn = sqlite3.connect(sqlite_path(target), timeout=30)
    try:
        with conn:
            return conn.execute(query, args).fetchall()
    finally:
        conn.close()


async def store_rows(target: Target, sqlite: str, postgres: str) -> list[tuple[Any, ...]]:
    """One statement on the test's own store, outside the bus (``{s}`` is the PostgreSQL schema)."""
    if target.kind == "sqlite":
        return [tuple(r) for r in _sqlite(target, sqlite)]
    return [tuple(r) for r in await _pg(target, postgres.replace("{s}", f'"{target.schema}"'))]


async def rewind(target: Target, name: str, seconds: float, *columns: str) -> None:
    """Move a schedule's times ``seconds`` into the past, as downtime (or time passing) would.

    By default its next occurrence and next run; ``columns`` names others.
    """
    columns = columns or ("next_occurrence_at", "next_run_at")
    if target.kind == "postgres":
        sets = ", ".join(f"{c} = {c} - $2 * interval '1 second'" for c in columns)
        await _pg(target, f"UPDATE schedules SET {sets} WHERE name = $1", name, seconds)
    else:
        sets = ", ".join(f"{c} = {c} - ?2" for c in columns)
        _sqlite(target, f"UPDATE schedules SET {sets} WHERE name = ?1", name, seconds)


async def event_keys(target: Target, event_type: str) -> list[str]:
    """The keys of every event of a type in the log, in id order."""
    if target.kind == "postgres":
        rows = await _pg(target, "SELECT key FROM events WHERE event_type = $1 ORDER BY id", event_type)
    else:
        rows = _sqlite(target, "SELECT key FROM events WHERE event_type = ? ORDER BY id", event_type)
    return [r[0] for r in rows]


async def db_now(target: Target) -> datetime:
    if target.kind == "postgres":
        return (await _pg(target, "SELECT now()"))[0][0]
    stamp = _sqlite(target, "SELECT (julianday('now') - 2440587.5) * 86400.0")[0][0]
    return datetime.fromtimestamp(stamp, UTC)
