"""The :class:`~eventbus.backends.base.SchemaStore` port on SQLite: migrations, statistics, the file."""

from __future__ import annotations

import sqlite3

import anyio

from ._db import SQLiteDb
from ._link import Queries

__all__ = ["SQLiteSchema"]


class SQLiteSchema:
    """The file's schema: migrated one ``BEGIN IMMEDIATE`` transaction per file, analysed, deleted."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def migrate(self) -> list[str]:
        """Apply pending migrations, one BEGIN IMMEDIATE transaction per file."""
        return await self._db.migrate()

    async def analyze(self) -> None:
        await self._db.write(_analyze)

    async def drop(self) -> None:
        await self._db.close()
        for suffix in ("", "-wal", "-shm"):
            await anyio.Path(self._db.path + suffix).unlink(missing_ok=True)


def _analyze(conn: sqlite3.Connection, q: Queries, now: float) -> None:
    conn.execute("ANALYZE")
