"""An interrupted migrate leaves no lock behind (PostgreSQL).

The pool does not reset sessions, so a session-level advisory lock whose
unlock was cut off by a cancellation would stay on an idle pooled connection
and block every later migrate, in any process.
"""

from __future__ import annotations

import time

import anyio
import asyncpg

from ..conftest import Target


async def test_a_cancelled_migrate_does_not_block_the_next_one(pg_target: Target) -> None:
    # Another session creates the schema and keeps its transaction open: the
    # migrate gets its lock, then waits on the schema mid-way and is cancelled there.
    other = await asyncpg.connect(pg_target.dsn)
    first, second = pg_target.bus(), pg_target.bus()
    try:
        await other.execute("BEGIN")
        await other.execute(f'CREATE SCHEMA "{pg_target.schema}"')
        with anyio.move_on_after(1) as scope:
            await first.migrate()
        assert scope.cancelled_caught, "the migrate was expected to wait on the open transaction"
        await other.execute("ROLLBACK")
        # The first bus stays open, its pooled connection idle: the next migrate must not wait on it.
        t0 = time.monotonic()
        with anyio.fail_after(10):
            applied = await second.migrate()
        print(f"\nsecond migrate took {time.monotonic() - t0:.2f}s")
        assert applied, "the second migrate applied nothing"
        assert await first.migrate() == []
    finally:
        await first.aclose()
        await second.aclose()
        await other.close()
