"""Transactional states: a state's own writes commit with its transition, or not at all.

The state writes rows of an application table through ``ctx.connection``
(asyncpg on PostgreSQL, aiosqlite on SQLite); the test reads them back with
a connection of its own, straight to the database.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest

from eventbus import Bus, ConfigurationError
from eventbus.workflows import FAILED, Machine, StepContext

from ...conftest import BusFactory, Target
from ...support.helpers import drain


class Stage(msgspec.Struct):
    id: str
    fail_first: bool = False
    hang_first: bool = False
    stale: bool = False


class Db:
    """The application's table ``rows(key, visit)`` on the test's target."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.table = "rows" if target.kind == "sqlite" else f'"{target.schema}".rows'

    def _path(self) -> str:
        return self.target.dsn.removeprefix("sqlite:///")

    async def run(self, sql: str) -> list[tuple[Any, ...]]:
        if self.target.kind == "sqlite":
            with sqlite3.connect(self._path(), isolation_level=None) as db:
                return [tuple(r) for r in db.execute(sql).fetchall()]
        conn = await asyncpg.connect(self.target.direct_dsn)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()

    async def write(self, ctx: StepContext, sql: str, *args: object) -> None:
        """A statement through the state's connection, ``$n`` placeholders turned into ``?`` on SQLite."""
        if self.target.kind == "sqlite":
            for n in range(len(args), 0, -1):
                sql = sql.replace(f"${n}", "?")
            await ctx.connection.execute(sql, args)
        else:
            await ctx.connection.execute(sql, *args)


db: Db | None = None
stages = Machine("stages", checkpoint=Stage, key=lambda c: c.id)


@stages.state(initial=True, on_success="DONE", on_failure="WRITE", max_visits=3, transactional=True)
async def WRITE(c: Stage, ctx: StepContext) -> None:
    assert db is not None
    await db.write(ctx, f"INSERT INTO {db.table} VALUES ($1, $2)", c.id, ctx.visit)
    if c.fail_first and ctx.visit == 1:
        raise RuntimeError("the stage failed after writing")
    if c.hang_first and ctx.visit == 1:
        await anyio.sleep(5)
    if c.stale:  # another writer moved the instance meanwhile: this visit's transition is refused
        prefix = "" if db.target.kind == "sqlite" else f'"{db.target.schema}".'
        await db.write(ctx, f"UPDATE {prefix}wf_instances SET version = version + 1 WHERE key = $1", c.id)


stages.terminal("DONE")
plain = Machine("plain_stages", checkpoint=Stage, key=lambda c: c.id)


@plain.state(initial=True, on_success="DONE", on_failure=FAILED)
async def PLAIN(c: Stage, ctx: StepContext) -> None:
    assert ctx.connection is None, "not reached: a state that is not transactional has no connection"


plain.terminal("DONE")


@pytest.fixture
async def sbus(make_bus: BusFactory, target: Target) -> Bus:
    global db
    bus = await make_bus()
    bus.include(stages)
    bus.include(plain)
    await bus.register()
    db = Db(target)
    await db.run(f"CREATE TABLE {db.table} (key text NOT NULL, visit integer NOT NULL)")
    return bus


async def test_the_state_writes_commit_with_its_transition(sbus: Bus) -> None:
    assert db is not None
    for key in ("a", "b", "c"):
        await sbus.workflows.start(stages, Stage(key))
    await drain(sbus)
    assert await db.run(f"SELECT key, visit FROM {db.table} ORDER BY key") == [("a", 1), ("b", 1), ("c", 1)]
    for key in ("a", "b", "c"):
        inst = await sbus.workflows.instance(stages, key)
        assert (inst.status, inst.state) == ("completed", "DONE")


async def test_a_raising_state_rolls_back_its_writes_and_its_failure_is_a_transition(sbus: Bus) -> None:
    assert db is not None
    await sbus.workflows.start(stages, Stage("f", fail_first=True))
    await drain(sbus)
    assert await db.run(f"SELECT key, visit FROM {db.table}") == [("f", 2)], "visit 1's row rolled back"
    history = await sbus.workflows.history(stages, "f")
    assert [(h.state, h.outcome) for h in history if h.state == "WRITE"] == [
        ("WRITE", "error"),
        ("WRITE", "ok"),
    ]
    assert (await sbus.workflows.instance(stages, "f")).status == "completed"


async def test_a_refused_transition_rolls_back_the_state_writes(sbus: Bus) -> None:
    assert db is not None
    await sbus.workflows.start(stages, Stage("s", stale=True))
    await drain(sbus)
    assert await db.run(f"SELECT count(*) FROM {db.table}") == [(0,)]
    inst = await sbus.workflows.instance(stages, "s")
    assert (inst.state, inst.version) == ("WRITE", 1), "nothing of the refused visit stayed"


async def test_a_state_that_is_not_transactional_has_no_connection(sbus: Bus) -> None:
    await sbus.workflows.start(plain, Stage("p"))
    await drain(sbus)
    inst = await sbus.workflows.instance(plain, "p")
    assert (inst.status, inst.last_error_code) == ("failed", ConfigurationError.__name__)
    assert "transactional=True" in (inst.last_error or "")


async def test_a_state_past_its_timeout_rolls_back_its_writes(
    sbus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert db is not None
    monkeypatch.setattr("eventbus.workflows._engine.TRANSACTIONAL_TIMEOUT_SECONDS", 0.3)
    await sbus.workflows.start(stages, Stage("h", hang_first=True))
    await drain(sbus)
    assert await db.run(f"SELECT key, visit FROM {db.table}") == [("h", 2)], "visit 1's row rolled back"
    errors = [h.error_code for h in await sbus.workflows.history(stages, "h") if h.outcome == "error"]
    assert errors == ["TimeoutError"]
