"""The command line, end to end on a real database (SQLite file and PostgreSQL)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ..conftest import Target
from ..support.cli import run_cli

APP = "tests.apps.cli_app:bus"


def eventbus(target: Target, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = run_cli(args, target.env())
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_publish_work_inspect_replay(target: Target) -> None:
    first = eventbus(target, "migrate").stdout
    assert first.startswith("applied: 0001_create_events.sql"), first
    assert eventbus(target, "migrate").stdout.strip() == "up to date"
    eventbus(target, "worker", APP, "--burst")  # registers the subscriptions
    out = eventbus(target, "publish", "cli.order", '{"order_id": "ok"}', "--key", "k1").stdout
    assert out.startswith("event ")
    again = eventbus(target, "publish", "cli.order", '{"order_id": "ok"}', "--key", "k1").stdout
    assert "duplicate" in again
    eventbus(target, "publish", "cli.order", '{"order_id": "fail"}', "--app", APP)
    eventbus(target, "worker", APP, "--burst")
    status = json.loads(eventbus(target, "status", "--json").stdout)
    by_status = {r["status"]: r["count"] for r in status["rows"]}
    assert by_status == {"completed": 1, "dead": 1} and status["events"] == 2
    dead = json.loads(eventbus(target, "dlq", "list", "--json").stdout)
    assert len(dead) == 1 and dead[0]["last_error"].startswith("ValueError: refused")
    shown = eventbus(target, "dlq", "show", str(dead[0]["id"])).stdout
    assert "attempt 1" in shown and "Traceback" in shown and '"order_id":"fail"' in shown
    assert "would be replayed: 1" in eventbus(target, "dlq", "replay", "--all", "--dry-run").stdout
    assert "replayed: 1" in eventbus(target, "dlq", "replay", "--subscription", "cli.handle").stdout
    assert "purged: 0" in eventbus(target, "dlq", "purge", "--all", "--yes").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("publish", "cli.order", "{not json"), "not valid JSON"),
        (("publish", "cli.order", "[1, 2]"), "must be a JSON object"),
        (("publish", "cli.order", '{"order_id": 1}', "--app", APP), "DecodeError"),
        (("publish", "nobody.handles", "{}", "--app", APP), "UnknownEventType"),
        (("dlq", "show", "999"), "NotFound"),
        (("dlq", "replay"), "--all"),
        (("worker", "no.such.module:bus"), "cannot import"),
    ],
)
def test_user_mistakes_print_one_clear_line(target: Target, args: tuple[str, ...], message: str) -> None:
    eventbus(target, "migrate")
    result = eventbus(target, *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_read_only_commands_do_not_create_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    target = Target("sqlite", f"sqlite:///{path}", None)
    for args in (("status",), ("dlq", "list")):
        result = eventbus(target, *args, check=False)
        assert result.returncode != 0
        assert result.stderr.strip().count("\n") == 0 and f"no eventbus database at {path}" in result.stderr
    assert not path.exists()


def test_bench_writes_a_png_chart(tmp_path: Path) -> None:
    target = Target("sqlite", f"sqlite:///{tmp_path / 'unused.db'}", None)
    chart = tmp_path / "bench.png"
    out = eventbus(target, "bench", "--n", "300", "--chart", str(chart)).stdout
    assert "drained" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
