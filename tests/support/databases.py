"""A PostgreSQL database per test process, so parallel test processes share nothing.

Each pytest-xdist worker (or a plain pytest run) creates its own database on the
run's server, named after the run and the worker, and drops it when it ends.
Database-wide reads (the backfill's view of open transactions, the default
``eventbus`` schema, ``pg_stat`` counters) then see only that process's tests.
A role that may not create databases keeps the DSN's own database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

T = TypeVar("T")

_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)[:12]


def database_name() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"eventbus_test_{_RUN}_{worker}"


def with_database(dsn: str, name: str) -> str:
    """``dsn`` pointing at database ``name`` (host, user and options kept)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end on a loop of its own (a session fixture may be set up inside a test's loop)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _create(dsn: str, name: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    except asyncpg.InsufficientPrivilegeError:
        return False
    finally:
        await conn.close()
    return True


async def _drop(dsn: str, name: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.contextmanager
def worker_database(server_dsn: str) -> Iterator[str]:
    """Yield the DSN of a fresh database of this process's own; drop it afterwards."""
    name = database_name()
    if not _run(_create(server_dsn, name)):
        yield server_dsn
        return
    try:
        yield with_database(server_dsn, name)
    finally:
        _run(_drop(server_dsn, name))


async def drop_schema(dsn: str, schema: str) -> None:
    """Drop a test's schema; sessions it left holding locks there are ended first, after 10 s.

    A test that ends (or fails) with a statement of its own still open, such as a
    PgBouncer server connection stuck mid-statement behind a client that went
    away, would otherwise make the drop wait forever.
    """
    drop = f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET lock_timeout = '10s'")
        try:
            await conn.execute(drop)
        except asyncpg.LockNotAvailableError:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM (SELECT DISTINCT l.pid FROM pg_locks l "
                "JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()) holders",
                schema,
            )
            await conn.execute("SET lock_timeout = 0")
            await conn.execute(drop)
    finally:
        await conn.close()
