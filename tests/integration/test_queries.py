"""Every named PostgreSQL query prepares on a migrated schema."""

from __future__ import annotations

import asyncpg


async def test_every_postgres_query_prepares(pg_target) -> None:
    bus = pg_target.bus()
    try:
        await bus.migrate()
        conn = await asyncpg.connect(pg_target.dsn)
        try:
            for name, sql in bus.backend.q.items():
                if name == "migrations_table":
                    continue
                await conn.prepare(sql)
        finally:
            await conn.close()
    finally:
        await bus.aclose()
