"""Guarded status moves on the application's own tables.

The pattern of a stage pipeline whose stage result and status change together::

    UPDATE stages SET status = 'done', output = $out WHERE id = $id AND status = 'running'

:func:`move_status` writes that one statement on a connection the caller holds
(asyncpg, or sqlite3 / aiosqlite), inside the caller's transaction, and says
whether the row moved: False means another writer moved it first (or there is
no such row), and nothing was written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigurationError

__all__ = ["move_status"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _quoted(name: str, what: str, *, dotted: bool = False) -> str:
    """``name`` as a quoted SQL identifier (``schema.table`` when ``dotted``); refuses anything else."""
    parts = name.split(".") if dotted and isinstance(name, str) else [name]
    if len(parts) > 2 or not all(isinstance(p, str) and _IDENTIFIER.fullmatch(p) for p in parts):
        raise ConfigurationError(
            f"{what} {name!r}: letters, digits and underscores, not starting with a digit"
            + (" (schema.table allowed)" if dotted else "")
        )
    return ".".join(f'"{p}"' for p in parts)


def _statement(
    table: str, column: str, id_column: str, expected: Sequence[str], also: Mapping[str, object], dollar: bool
) -> str:
    """The UPDATE with numbered ($1) or positional (?) placeholders, in the order of :func:`_values`."""
    n = 0

    def slot() -> str:
        nonlocal n
        n += 1
        return f"${n}" if dollar else "?"

    sets = [f"{_quoted(column, 'column')} = {slot()}"]
    sets += [f"{_quoted(name, 'column')} = {slot()}" for name in also]
    where = f"{_quoted(id_column, 'id column')} = {slot()}"
    guard = ", ".join(slot() for _ in expected)
    return (
        f"UPDATE {_quoted(table, 'table', dotted=True)} SET {', '.join(sets)} "
        f"WHERE {where} AND {_quoted(column, 'column')} IN ({guard})"
    )


def _driver(conn: object) -> str:
    """``asyncpg``, ``aiosqlite`` or ``sqlite3``: which driver ``conn`` belongs to (by its type's module)."""
    module = type(conn).__module__.split(".")[0]
    if module in ("asyncpg", "aiosqlite", "sqlite3"):
        return module
    raise ConfigurationError(
        "move_status takes an asyncpg connection (or pool), or a sqlite3 or aiosqlite connection, "
        f"not {type(conn).__qualname__}"
    )


async def _run(driver: str, conn: Any, sql: str, values: list[object]) -> int:
    """Run ``sql`` on ``conn``; the number of rows it changed."""
    if driver == "asyncpg":
        tag = await conn.execute(sql, *values)  # "UPDATE <n>"
        return int(tag.rsplit(" ", 1)[-1])
    if driver == "aiosqlite":
        cursor = await conn.execute(sql, values)
        try:
            return int(cursor.rowcount)
        finally:
            await cursor.close()
    return int(conn.execute(sql, values).rowcount)


async def move_status(
    conn: Any,
    table: str,
    id: object,
    *,
    expect: str | Sequence[str],
    to: str,
    column: str = "status",
    id_column: str = "id",
    also: Mapping[str, object] | None = None,
) -> bool:
    """Move row ``id`` of ``table`` from status ``expect`` to ``to``, in one guarded statement.

    ``UPDATE table SET column = to [, also…] WHERE id_column = id AND column IN (expect…)``:
    True when the row moved, False when it was not in ``expect`` (another
    writer moved it first) or does not exist, and then nothing is written.
    ``also`` sets more columns in the same statement (a stage's output with its
    status). It runs in the caller's transaction and does not commit: on
    asyncpg, open ``conn.transaction()`` around it and the rest of the work; on
    sqlite3 / aiosqlite, commit when done.

    :param conn: an asyncpg connection or pool, or a sqlite3 or aiosqlite connection.
    :param expect: the status (or statuses) the row must have now.
    :raises ConfigurationError: another kind of connection, a table or column name
        that is not a plain identifier (``schema.table`` allowed), or no expected status.
    """
    expected = [expect] if isinstance(expect, str) else list(expect)
    if not expected:
        raise ConfigurationError("say which status the row must have now: expect=... (one or more)")
    extra = dict(also or {})
    if column in extra:
        raise ConfigurationError(f"{column!r} is the status column: set it with to=..., not also=")
    driver = _driver(conn)
    sql = _statement(table, column, id_column, expected, extra, dollar=driver == "asyncpg")
    return await _run(driver, conn, sql, [to, *extra.values(), id, *expected]) > 0
