"""Fixtures of the fault-injection suite (PostgreSQL only, real processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from ...conftest import Target
from ._support import Procs, prepare


@pytest.fixture
async def fault_target(pg_target: Target) -> Target:
    await prepare(pg_target)
    return pg_target


@pytest.fixture
async def procs(fault_target: Target, tmp_path: Path) -> AsyncIterator[Procs]:
    p = Procs(fault_target, tmp_path)
    try:
        yield p
    finally:
        await p.aclose()


@pytest.fixture
async def db(fault_target: Target) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(fault_target.dsn)
    try:
        yield conn
    finally:
        await conn.close()
