"""Transactional handlers: the handler's own writes commit with its delivery's completion, or not at all.

Each test writes rows of an application table through ``ctx.connection``
(asyncpg on PostgreSQL, aiosqlite on SQLite) and reads them back with a
connection of its own, straight to the database.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import anyio
import asyncpg
import pytest

from eventbus import Bus, ConfigurationError, Context, RetryPolicy
from eventbus.backends.base import Completion
from eventbus.guarded import move_status

from ...conftest import Target
from ...support.helpers import OrderPlaced, PaymentRequested, counts, drain

# Through PgBouncer too: the handler's transaction runs on a pooled connection held across statements.
pytestmark = [pytest.mark.pooler, pytest.mark.append_only]

WORKER_A = "00000000-0000-4000-8000-00000000000a"
ONCE = RetryPolicy(max_attempts=1)


class App:
    """The application's tables on the test's target: ``rows(key, note)``, ``stages(id, status, output)``."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.table = "rows" if target.kind == "sqlite" else f'"{target.schema}".rows'
        self.stages = "stages" if target.kind == "sqlite" else f"{target.schema}.stages"

    async def create(self) -> None:
        await self._run(
            f"CREATE TABLE {self.table} (key text NOT NULL, note text NOT NULL)",
            f"CREATE TABLE {self.stages} (id integer PRIMARY KEY, status text, output text)",
            f"INSERT INTO {self.stages} (id, status) VALUES (1, 'running')",
        )

    async def _run(self, *statements: str) -> None:
        if self.target.kind == "sqlite":
            with sqlite3.connect(self.target.dsn.removeprefix("sqlite:///"), isolation_level=None) as db:
                for sql in statements:
                    db.execute(sql)
            return
        conn = await asyncpg.connect(self.target.direct_dsn)
        try:
            for sql in statements:
                await conn.execute(sql)
        finally:
            await conn.close()

    async def insert(self, ctx: Context, key: str, note: str) -> None:
        """One row, through the handler's connection (in its transaction)."""
        if self.target.kind == "sqlite":
            await ctx.connection.execute(f"INSERT INTO {self.table} VALUES (?, ?)", (key, note))
        else:
            await ctx.connection.execute(f"INSERT INTO {self.table} VALUES ($1, $2)", key, note)

    async def rows(self, sql: str = "") -> list[tuple[Any, ...]]:
        query = sql or f"SELECT key, note FROM {self.table} ORDER BY key, note"
        if self.target.kind == "sqlite":
            with sqlite3.connect(self.target.dsn.removeprefix("sqlite:///")) as db:
                return [tuple(r) for r in db.execute(query).fetchall()]
        conn = await asyncpg.connect(self.target.direct_dsn)
        try:
            return [tuple(r) for r in await conn.fetch(query)]
        finally:
            await conn.close()


@pytest.fixture
async def app(target: Target, bus: Bus) -> App:
    await bus.register()  # migrated before the application's tables go in
    application = App(target)
    await application.create()
    return application


async def test_writes_commit_with_the_completion_and_its_follow_up(bus, app) -> None:
    @bus.subscribe(OrderPlaced, name="h", transactional=True)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        await app.insert(ctx, event.order_id, "placed")
        ctx.emit(PaymentRequested(order_id=event.order_id), key=f"pay:{event.order_id}")

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(5)])
    drained = await drain(bus)
    assert drained.processed == 5
    assert await app.rows() == [(f"o-{i}", "placed") for i in range(5)]
    assert (await counts(bus))[("h", "completed")] == 5
    assert (await bus.status()).events == 10  # five orders, five follow-ups


async def test_a_raising_handler_rolls_back_its_writes_and_its_failure_is_recorded(bus, app) -> None:
    @bus.subscribe(OrderPlaced, name="h", transactional=True, retry=ONCE)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        await app.insert(ctx, event.order_id, "written before the error")
        ctx.emit(PaymentRequested(order_id=event.order_id))
        raise ValueError("no stock")

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert await app.rows() == []
    assert (await bus.status()).events == 1  # no follow-up
    (dead,) = await bus.dead_letters()
    detail = await bus.delivery(dead.id)
    assert [(a.error_type, a.message) for a in detail.history] == [("ValueError", "no stock")]


async def test_a_handler_past_its_timeout_rolls_back(bus, app) -> None:
    @bus.subscribe(OrderPlaced, name="h", transactional=True, retry=ONCE, timeout_seconds=0.3)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        await app.insert(ctx, event.order_id, "then hung")
        await anyio.sleep(5)

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert await app.rows() == []
    (dead,) = await bus.dead_letters()
    assert (await bus.delivery(dead.id)).history[0].error_type == "HandlerTimeout"


async def test_a_retried_handler_commits_only_its_successful_run(bus, app) -> None:
    retry = RetryPolicy(max_attempts=3, base_delay_seconds=0.0, jitter=0.0)

    @bus.subscribe(OrderPlaced, name="h", transactional=True, retry=retry)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        await app.insert(ctx, event.order_id, f"attempt {ctx.attempt}")
        if ctx.attempt < 3:
            raise RuntimeError("flaky")

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert await app.rows() == [("o-1", "attempt 3")]


async def test_a_stale_lease_rolls_the_transaction_back(bus, app) -> None:
    """The run whose lease was taken over writes, then its commit is refused: nothing of it stays."""

    @bus.subscribe(OrderPlaced, name="h", transactional=True)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    store = bus.backend.deliveries
    (old,) = await store.claim(1, 1, 0.2, WORKER_A)
    await anyio.sleep(0.3)
    assert await store.recover_expired() == 1
    (new,) = await store.claim(1, 1, 30, WORKER_A)
    follow_up = bus.outgoing(PaymentRequested(order_id="stale"))
    async with store.transaction(5.0) as transaction:
        await transaction.connection.execute(f"INSERT INTO {app.table} VALUES ('o-1', 'stale run')")
        assert not await transaction.commit(Completion(old.id, old.lease_token, (follow_up,)))
    assert await app.rows() == []
    assert (await bus.status()).events == 1
    assert (await bus.delivery(new.id)).status == "processing"  # the fresh run still holds it
    async with store.transaction(5.0) as transaction:
        assert await transaction.commit(Completion(new.id, new.lease_token))
    assert (await bus.delivery(new.id)).status == "completed"


async def test_a_cancelled_delivery_rolls_the_transaction_back(bus, app) -> None:
    @bus.subscribe(OrderPlaced, name="h", transactional=True)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    store = bus.backend.deliveries
    (claimed,) = await store.claim(1, 1, 30, WORKER_A)
    # handed back (a worker stopping) and cancelled by an operator while this run still writes
    assert await store.release([claimed.id], claimed.lease_token) == 1
    assert await bus.cancel([claimed.id]) == 1
    async with store.transaction(5.0) as transaction:
        await transaction.connection.execute(f"INSERT INTO {app.table} VALUES ('o-1', 'x')")
        assert not await transaction.commit(Completion(claimed.id, claimed.lease_token))
    assert await app.rows() == []


async def test_a_stage_result_and_its_status_commit_with_the_delivery(bus, app) -> None:
    """The guarded status move of the application's own table, in the delivery's transaction."""
    moved: list[bool] = []

    @bus.subscribe(OrderPlaced, name="stage", transactional=True)
    async def stage(event: OrderPlaced, ctx: Context) -> None:
        moved.append(
            await move_status(
                ctx.connection, app.stages, 1, expect="running", to="done", also={"output": event.order_id}
            )
        )
        ctx.emit(PaymentRequested(order_id=event.order_id))

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id="first"), OrderPlaced(order_id="second")])
    await drain(bus)
    assert sorted(moved) == [False, True]  # the second run found the stage done already
    assert await app.rows(f"SELECT status, output FROM {app.stages}") in (
        [("done", "first")],
        [("done", "second")],
    )
    assert (await bus.status()).events == 4


async def test_a_plain_handler_has_no_connection(bus, app) -> None:
    seen: list[str] = []

    @bus.subscribe(OrderPlaced, name="plain")
    async def plain(event: OrderPlaced, ctx: Context) -> None:
        try:
            seen.append(ctx.connection)
        except ConfigurationError as exc:
            seen.append(str(exc))

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert len(seen) == 1 and "transactional=True" in seen[0]


async def test_transactional_handlers_get_a_default_timeout(bus) -> None:
    @bus.subscribe(OrderPlaced, name="t", transactional=True)
    async def t(event: OrderPlaced, ctx: Context) -> None:
        pass

    @bus.subscribe(OrderPlaced, name="long", transactional=True, timeout_seconds=30.0)
    async def long(event: OrderPlaced, ctx: Context) -> None:
        pass

    assert bus.subscriptions["t"].timeout_seconds == 10.0
    assert bus.subscriptions["long"].timeout_seconds == 30.0
