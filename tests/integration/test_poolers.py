"""The bus through a real PgBouncer (transaction and session pooling), end to end.

Commands and a worker run as separate processes on a DSN that goes through
PgBouncer: migrations twice and at once, ``status``, ``publish``, and a
worker woken across processes by LISTEN on a direct ``listen_dsn``, by the
short poll when it has none, or by LISTEN through a session pooler. The
worker's slow poll is a minute long, so work finished sooner came from the
wake-up under test.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import asyncpg
import pytest

from eventbus import Bus, Context

from ..support.cli import run_cli
from ..support.helpers import OrderPlaced, drain
from ..support.pgbouncer import PgBouncer
from ..support.processes import EVENTBUS, ProcessGroup

APP = "tests.apps.cli_app:bus"


@pytest.fixture
async def schema(pg_dsn: str) -> AsyncIterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = run_cli(args, env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


async def completed(pg_dsn: str, schema: str) -> int:
    conn = await asyncpg.connect(pg_dsn)
    try:
        return int(
            await conn.fetchval(f"SELECT count(*) FROM \"{schema}\".deliveries WHERE status = 'completed'")
        )
    finally:
        await conn.close()


async def wait_for(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 30.0) -> None:
    """Wait until ``check()`` holds; fail naming ``what`` after ``seconds``."""
    with anyio.move_on_after(seconds):
        while not await check():
            await anyio.sleep(0.1)
        return
    raise AssertionError(f"not within {seconds:g}s: {what}")


async def listener_up(pg_dsn: str, schema: str) -> bool:
    conn = await asyncpg.connect(pg_dsn)
    try:
        return bool(await conn.fetchval(f'SELECT bool_or(listener_ok) FROM "{schema}".workers'))
    except asyncpg.UndefinedTableError:
        return False
    finally:
        await conn.close()


def pooled_dsn(bouncer: PgBouncer, pg_dsn: str, wake: str) -> str:
    if bouncer.mode == "session":
        return f"{bouncer.dsn_for(pg_dsn)}?pooler=session"
    options = {"pooler": "transaction"}
    if wake == "listen_dsn":
        options["listen_dsn"] = pg_dsn
    else:
        options["poll_interval_seconds"] = "0.2"
    return f"{bouncer.dsn_for(pg_dsn)}?{urllib.parse.urlencode(options)}"


@pytest.mark.parametrize(
    ("mode", "wake"),
    [("transaction", "listen_dsn"), ("transaction", "poll"), ("session", "listen")],
)
async def test_migrate_status_publish_and_a_worker_through_pgbouncer(
    mode: str,
    wake: str,
    pgbouncer: PgBouncer,
    pg_dsn: str,
    schema: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    bouncer = pgbouncer if mode == "transaction" else request.getfixturevalue("pgbouncer_session")
    group = ProcessGroup(tmp_path)
    env = group.env({"EVENTBUS_DSN": pooled_dsn(bouncer, pg_dsn, wake), "EVENTBUS_SCHEMA": schema})
    assert run(env, "migrate").stdout.startswith("applied: 0001_create_events.sql")
    assert run(env, "migrate").stdout.strip() == "up to date"
    worker = group.spawn([EVENTBUS, "worker", APP, "--poll-interval", "60"], env, "worker")
    try:
        await wait_for(lambda: listener_up(pg_dsn, schema), "the worker listens (or polls)")
        started = time.monotonic()
        for n in range(3):
            out = run(env, "publish", "cli.order", json.dumps({"order_id": f"o-{n}"})).stdout
            assert out.startswith("event ")
        await wait_for(lambda: _all_done(pg_dsn, schema, 3), "3 deliveries completed", seconds=30)
        woken_within = time.monotonic() - started
        status = json.loads(run(env, "status", "--json").stdout)
        assert {r["status"]: r["count"] for r in status["rows"]} == {"completed": 3}
        assert [w["listener_ok"] for w in status["workers"]] == [True]
        worker.signal(signal.SIGTERM)
        assert await worker.wait_async(20) == 0, worker.output()
    finally:
        await group.aclose()
    log = worker.output()
    assert "prepared statement" not in log and "Traceback" not in log, log
    assert ("polling for work every 0.2s" in log) == (wake == "poll"), log
    assert woken_within < 30  # well inside the worker's one-minute slow poll


async def _all_done(pg_dsn: str, schema: str, count: int) -> bool:
    return await completed(pg_dsn, schema) >= count


async def test_concurrent_migrations_through_a_transaction_pooler_apply_each_file_once(
    pgbouncer: PgBouncer, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """The migration lock is transaction-scoped, in each file's transaction: it holds through a pooler."""
    group = ProcessGroup(tmp_path)
    env = group.env({"EVENTBUS_DSN": pooled_dsn(pgbouncer, pg_dsn, "poll"), "EVENTBUS_SCHEMA": schema})
    runners = [group.spawn([EVENTBUS, "migrate"], env, "migrate", split_stdout=True) for _ in range(3)]
    try:
        codes = [await p.wait_async(60) for p in runners]
    finally:
        await group.aclose()
    assert codes == [0, 0, 0], [p.output() for p in runners]
    conn = await asyncpg.connect(pg_dsn)
    try:
        versions = [r[0] for r in await conn.fetch(f'SELECT version FROM "{schema}".schema_migrations')]
    finally:
        await conn.close()
    assert sorted(versions) == sorted(set(versions)) and len(versions) >= 8


def test_a_dsn_without_the_pooler_option_fails_in_one_line_naming_it(
    pgbouncer: PgBouncer, pg_dsn: str, schema: str
) -> None:
    """PgBouncer refuses the session settings a direct bus sends when each connection starts."""
    env = ProcessGroup(Path()).env({"EVENTBUS_DSN": pgbouncer.dsn_for(pg_dsn), "EVENTBUS_SCHEMA": schema})
    result = subprocess.run(
        [sys.executable, "-m", "eventbus", "migrate"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "startup parameter" in result.stderr and "?pooler=transaction" in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr


# A process of its own per bus: asyncpg numbers its statements per process, so
# only another process prepares ``__asyncpg_stmt_1__`` again.
_STATUS = """
import sys, anyio
from eventbus import Bus
async def main():
    async with Bus(sys.argv[1], schema=sys.argv[2], dead_client_seconds=None, migrate=True) as bus:
        await bus.status()
anyio.run(main)
"""


def test_prepared_statements_through_a_transaction_pooler_are_named_in_the_error(
    pgbouncer: PgBouncer, pg_dsn: str, schema: str
) -> None:
    """Without the pooler option (and without session settings), named statements collide.

    The first process prepares ``__asyncpg_stmt_1__``… on server connections
    the pooler keeps; the next one's first statement of the same name is refused.
    """
    env = ProcessGroup(Path()).env()
    args = [sys.executable, "-c", _STATUS, pgbouncer.dsn_for(pg_dsn), schema]
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert "BackendError: PostgreSQL refused the operation: prepared statement" in second.stderr
    assert "Add ?pooler=transaction to the DSN" in second.stderr


@pytest.mark.parametrize("mode", ["transaction", "session"])
async def test_the_append_only_path_through_pgbouncer(
    mode: str, pg_dsn: str, schema: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """A pooler refuses startup parameters: the plan settings the ring needs are set on each
    session behind a session pooler, and behind a transaction pooler (whose sessions are shared)
    the bus says once that they belong on the role, naming the statement."""
    bouncer: PgBouncer = request.getfixturevalue(
        "pgbouncer" if mode == "transaction" else "pgbouncer_session"
    )
    seen: list[str] = []
    bus = Bus(f"{bouncer.dsn_for(pg_dsn)}?pooler={mode}", schema=schema, append_only=True)

    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        seen.append(event.order_id)

    try:
        with caplog.at_level(logging.WARNING, logger="eventbus.postgres"):
            await bus.migrate()
            await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(20)])
            await drain(bus)
        assert sorted(seen) == sorted(f"o-{i}" for i in range(20))
        said = [r.getMessage() for r in caplog.records if r.name == "eventbus.postgres"]
        if mode == "session":
            async with bus.backend.db.conn() as conn:  # type: ignore[attr-defined]
                assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
                assert await conn.fetchval("SHOW jit") == "off"
            assert said == []
        else:
            assert len(said) == 1 and "ALTER ROLE <role> SET plan_cache_mode = force_custom_plan" in said[0]
    finally:
        await bus.aclose()
