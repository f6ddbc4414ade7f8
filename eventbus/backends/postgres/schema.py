"""The schema port on PostgreSQL: migrations under an advisory lock, statistics, dropping."""

from __future__ import annotations

from typing import Any

import asyncpg

from .. import _migrations as migrations
from .._sql import quote_schema
from ._db import PgDb

__all__ = ["PgSchema"]


class PgSchema:
    """:class:`~eventbus.backends.ports.SchemaStore` on one PostgreSQL schema."""

    def __init__(self, db: PgDb) -> None:
        self.db = db

    async def check(self) -> None:
        """Refuse a schema that is missing or behind (``open`` without ``migrate``)."""
        async with self.db.pool_conn("opening") as conn:
            try:
                rows = await conn.fetch(self.db.q["migrations_applied"])
            except (asyncpg.exceptions.UndefinedTableError, asyncpg.exceptions.InvalidSchemaNameError):
                raise migrations.not_migrated(self._where, []) from None
        todo = migrations.pending(
            migrations.discover("postgres"), {r["version"]: r["checksum"] for r in rows}
        )
        if todo:
            raise migrations.not_migrated(self._where, todo)
        self.db.ready = True

    @property
    def _where(self) -> str:
        return f"PostgreSQL schema {self.db.schema!r}"

    async def migrate(self) -> list[str]:
        """Apply pending migrations, one transaction per file; return the names applied."""
        applied_now: list[str] = []
        async with self.db.pool_conn("migrate") as conn:
            while (name := await self._migrate_next(conn)) is not None:
                applied_now.append(name)
        self.db.ready = True
        return applied_now

    async def _migrate_next(self, conn: Any) -> str | None:
        """Apply the first pending file under the migration lock; None when none is left.

        The lock is transaction-scoped: it ends with the transaction however the
        call ends, so a cancelled migrate cannot leave it on a pooled connection.
        """
        q, schema = self.db.q, quote_schema(self.db.schema)
        async with conn.transaction():
            await conn.execute(q["migration_lock"], self.db.channel)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            await conn.execute(q["migrations_table"])
            rows = await conn.fetch(q["migrations_applied"])
            todo = migrations.pending(
                migrations.discover("postgres"), {r["version"]: r["checksum"] for r in rows}
            )
            if not todo:
                return None
            await conn.execute(todo[0].sql.replace("{schema}", schema))
            await conn.execute(q["migration_record"], todo[0].version, todo[0].name, todo[0].checksum)
        return todo[0].name

    async def analyze(self) -> None:
        """Refresh the planner's statistics of the bus's tables (see ``SchemaStore.analyze``)."""
        async with self.db.pool_conn("analyze") as conn:
            await conn.execute(self.db.q["analyze"])

    async def drop(self) -> None:
        """Drop the schema with everything in it, then close the backend's connections."""
        async with self.db.pool_conn("drop") as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_schema(self.db.schema)} CASCADE")
        await self.db.aclose()
