"""Fixtures: every contract test runs on PostgreSQL and on a SQLite file.

PostgreSQL comes from ``EVENTBUS_TEST_DSN`` when set; otherwise a throwaway
server is started from the local binaries. It is never skipped. Each test gets
a fresh schema (PostgreSQL) or a fresh file (SQLite).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from eventbus import Bus

from .support.pgserver import PgServer

BACKENDS = ["postgres", "sqlite"]


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    dsn = os.environ.get("EVENTBUS_TEST_DSN")
    if dsn:
        yield dsn
        return
    server = PgServer().start()
    try:
        yield server.dsn
    finally:
        server.destroy()


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Target:
    """Where a test's bus lives: a DSN plus, on PostgreSQL, its own schema."""

    def __init__(self, kind: str, dsn: str, schema: str | None) -> None:
        self.kind = kind
        self.dsn = dsn
        self.schema = schema

    def env(self) -> dict[str, str]:
        env = dict(os.environ, EVENTBUS_DSN=self.dsn)
        if self.schema:
            env["EVENTBUS_SCHEMA"] = self.schema
        return env

    def bus(self, **options: object) -> Bus:
        return Bus(self.dsn, schema=self.schema, **options)  # type: ignore[arg-type]


@pytest.fixture
async def target(backend_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    if backend_kind == "sqlite":
        yield Target("sqlite", f"sqlite:///{tmp_path / 'bus.db'}", None)
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield Target("postgres", dsn, schema)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def pg_target(pg_dsn: str) -> AsyncIterator[Target]:
    """A PostgreSQL-only target, for tests of PostgreSQL features."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield Target("postgres", pg_dsn, schema)
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


BusFactory = Callable[..., Awaitable[Bus]]


@pytest.fixture
async def make_bus(target: Target) -> AsyncIterator[BusFactory]:
    """Build migrated buses on the test's target; all are closed afterwards."""
    buses: list[Bus] = []

    async def factory(**options: object) -> Bus:
        bus = target.bus(**options)
        await bus.migrate()
        buses.append(bus)
        return bus

    yield factory
    for bus in buses:
        await bus.aclose()


@pytest.fixture
async def bus(make_bus: BusFactory) -> Bus:
    return await make_bus()
