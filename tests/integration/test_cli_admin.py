"""Command line: subscriptions admin, cancel, and options that must be honoured or refused."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from eventbus.backends.ports import RollupRow

from ..conftest import Target
from .test_cli import APP, eventbus

ROOT = Path(__file__).resolve().parents[2]


async def _delivery_ids(target: Target) -> list[int]:
    if target.kind == "sqlite":
        with sqlite3.connect(target.dsn.removeprefix("sqlite:///")) as db:
            return [r[0] for r in db.execute("SELECT id FROM deliveries ORDER BY id")]
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        rows = await conn.fetch(f'SELECT id FROM "{target.schema}".deliveries ORDER BY id')
        return [r[0] for r in rows]
    finally:
        await conn.close()


def _subscriptions(target: Target) -> dict[str, dict[str, object]]:
    rows = json.loads(eventbus(target, "subscriptions", "list", "--json").stdout)
    return {r["name"]: r for r in rows}


def test_subscriptions_list_pause_resume_remove(target: Target) -> None:
    eventbus(target, "migrate")
    eventbus(target, "worker", APP, "--burst")
    assert "paused cli.handle" in eventbus(target, "subscriptions", "pause", "cli.handle").stdout
    eventbus(target, "publish", "cli.order", '{"order_id": "ok"}')
    eventbus(target, "worker", APP, "--burst")  # paused: nothing is claimed
    sub = _subscriptions(target)["cli.handle"]
    assert sub["state"] == "paused" and sub["pending"] == 1 and sub["worker_seen_at"] is not None
    table = eventbus(target, "subscriptions", "list").stdout
    assert "cli.handle" in table and "paused" in table and "ago" in table
    assert "subscription cli.handle is paused: 1 pending" in eventbus(target, "status").stdout
    assert "resumed cli.handle" in eventbus(target, "subscriptions", "resume", "cli.handle").stdout
    eventbus(target, "worker", APP, "--burst")
    assert _subscriptions(target)["cli.handle"]["pending"] == 0
    eventbus(target, "publish", "cli.order", '{"order_id": "ok2"}')
    out = eventbus(target, "subscriptions", "remove", "cli.handle", "--yes").stdout
    assert "removed cli.handle: 1 pending deliveries cancelled" in out
    eventbus(target, "publish", "cli.order", '{"order_id": "ok3"}')
    status = json.loads(eventbus(target, "status", "--json").stdout)
    assert {r["status"]: r["count"] for r in status["rows"]} == {"completed": 1, "cancelled": 1}
    missing = eventbus(target, "subscriptions", "pause", "nope", check=False)
    assert missing.returncode != 0 and "NotFound: no subscription named 'nope'" in missing.stderr


def test_status_flags_a_subscription_no_worker_serves(target: Target) -> None:
    eventbus(target, "migrate")
    env = {**target.env(), "PYTHONPATH": str(ROOT)}
    register = (
        "import anyio\nfrom tests.apps.cli_app import bus\n"
        "async def main():\n    async with bus:\n        await bus.register()\n"
        "anyio.run(main)\n"
    )
    subprocess.run([sys.executable, "-c", register], env=env, check=True, timeout=60)
    assert "subscription cli.handle was never served by a worker" in eventbus(target, "status").stdout


async def test_cancel_moves_pending_deliveries_only(target: Target) -> None:
    eventbus(target, "migrate")
    eventbus(target, "worker", APP, "--burst")
    eventbus(target, "publish", "cli.order", '{"order_id": "later"}', "--delay", "3600")
    eventbus(target, "publish", "cli.order", '{"order_id": "now"}')
    eventbus(target, "worker", APP, "--burst")
    later, done = await _delivery_ids(target)
    out = eventbus(target, "cancel", str(later), str(done)).stdout
    assert out.strip() == "cancelled: 1 (1 not pending, left alone)"
    assert eventbus(target, "cancel", str(later)).stdout.strip() == "cancelled: 0 (1 not pending, left alone)"
    status = json.loads(eventbus(target, "status", "--json").stdout)
    assert {r["status"]: r["count"] for r in status["rows"]} == {"cancelled": 1, "completed": 1}
    assert eventbus(target, "cancel", check=False).returncode != 0  # IDs are required


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("publish", "bad type!", "{}"), "invalid event_type 'bad type!'"),
        (("publish", "cli.order", "{}", "--delay", "inf"), "delay must be a finite number"),
        (("worker", APP, "--recovery-interval", "0"), "recovery_interval_seconds must be"),
        (("worker", APP, "--poll-interval", "-1"), "poll_interval_seconds must be"),
        (("worker", APP, "--grace", "-1"), "grace_seconds must be"),
        (("worker", APP, "--concurrency", "0"), "concurrency must be at least 1"),
        (("worker", APP, "--subscription", "cli.hadnle"), "no subscription named cli.hadnle"),
        (("--dsn", "postgresql://h:abc/db", "status"), "invalid PostgreSQL DSN"),
        (("--dsn", "postgresql://[::1/db", "status"), "invalid PostgreSQL DSN"),
    ],
)
def test_bad_inputs_print_one_line_and_fail(target: Target, args: tuple[str, ...], message: str) -> None:
    eventbus(target, "migrate")
    result = eventbus(target, *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0


def test_worker_app_built_on_a_malformed_dsn_fails_with_one_line(target: Target) -> None:
    env = {**target.env(), "EVENTBUS_DSN": "postgresql://[::1/db"}
    result = subprocess.run(
        [sys.executable, "-m", "eventbus", "worker", APP], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "invalid PostgreSQL DSN" in result.stderr and result.stderr.strip().count("\n") == 0


def test_worker_refuses_a_schema_its_app_was_not_built_with(target: Target) -> None:
    eventbus(target, "migrate")
    result = eventbus(target, "--schema", "elsewhere", "worker", APP, "--burst", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    expected = "differs from the schema" if target.kind == "postgres" else "applies to PostgreSQL only"
    assert expected in result.stderr


def test_publish_with_app_writes_where_the_options_say(target: Target, tmp_path: Path) -> None:
    eventbus(target, "migrate")
    eventbus(target, "worker", APP, "--burst")
    env = {k: v for k, v in os.environ.items() if k not in ("EVENTBUS_DSN", "EVENTBUS_SCHEMA")}
    env["PYTHONPATH"] = str(ROOT)
    options = ["--dsn", target.dsn] + (["--schema", target.schema] if target.schema else [])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventbus",
            *options,
            "publish",
            "cli.order",
            '{"order_id": "x"}',
            "--app",
            APP,
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "eventbus.db").exists()  # the app's own default was not used
    status = json.loads(eventbus(target, "status", "--json").stdout)
    assert status["events"] == 1


async def test_prune_keeps_the_throughput_rollup_as_long_as_told(target: Target) -> None:
    eventbus(target, "migrate")
    eventbus(target, "worker", APP, "--burst")  # registers the subscriptions
    async with target.bus() as bus:
        (name, *_) = [s.name for s in await bus.list_subscriptions()]
        three_days_ago = (int(time.time()) - 3 * 86400) // 60 * 60
        rows = [RollupRow(name, three_days_ago - 60 * i, completed=1) for i in range(2)]
        assert await bus.backend.rollup.record(rows) == 2
    kept = eventbus(target, "prune", "--dry-run", "--rollup-retention", "4").stdout
    assert "0 throughput rollup rows" in kept
    dry = eventbus(target, "prune", "--dry-run", "--rollup-retention", "2").stdout
    assert "would delete:" in dry and "2 throughput rollup rows" in dry
    assert "2 throughput rollup rows" in eventbus(target, "prune").stdout  # two days by default
    assert "0 throughput rollup rows" in eventbus(target, "prune", "--dry-run").stdout
