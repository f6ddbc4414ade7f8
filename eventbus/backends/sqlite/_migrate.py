"""Applying the SQLite migration files: what is applied, and the next file as one transaction."""

from __future__ import annotations

import sqlite3

from .. import _migrations as migrations
from ._link import Queries

__all__ = ["applied_migrations", "apply_next_migration", "pending"]


def _statements(sql: str) -> list[str]:
    """Split a migration file into statements, as the sqlite3 shell does."""
    statements, buffer = [], ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer)
            buffer = ""
    return statements


def applied_migrations(conn: sqlite3.Connection, q: Queries) -> dict[int, str] | None:
    """Applied versions and checksums, or None before the first migration."""
    try:
        rows = conn.execute(q["migrations_applied"]).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return {int(r[0]): str(r[1]) for r in rows}


def pending(applied: dict[int, str] | None) -> list[migrations.Migration]:
    """The migration files not applied yet, in order (a changed applied file is refused)."""
    return migrations.pending(migrations.discover("sqlite"), applied or {})


def apply_next_migration(conn: sqlite3.Connection, q: Queries, now: float) -> str | None:
    """Apply the first pending migration (under the write lock); None when done."""
    conn.execute(q["migrations_table"])
    todo = pending(applied_migrations(conn, q))
    if not todo:
        return None
    m = todo[0]
    for statement in _statements(m.sql):
        conn.execute(statement)
    record = {"version": m.version, "name": m.name, "checksum": m.checksum, "now": now}
    conn.execute(q["migration_record"], record)
    return m.name
