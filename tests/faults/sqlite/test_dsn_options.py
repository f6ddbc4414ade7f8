"""SQLite options in the DSN query string: ``sqlite:///path?synchronous=NORMAL&busy_timeout_ms=N``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from eventbus import Bus, ConfigurationError
from eventbus.backends.sqlite import SQLiteBackend
from eventbus.backends.sqlite._dsn import DsnOptions, parse_dsn
from eventbus.backends.sqlite._link import BUSY_SLICE_MS

from ...support.processes import EVENTBUS, ROOT


def test_parse_dsn_reads_known_options() -> None:
    assert parse_dsn("sqlite:////tmp/a.db") == DsnOptions("/tmp/a.db")
    assert parse_dsn("sqlite:////tmp/a.db?synchronous=normal") == DsnOptions("/tmp/a.db", "NORMAL")
    assert parse_dsn("sqlite:////tmp/a.db?busy_timeout_ms=250&synchronous=EXTRA") == DsnOptions(
        "/tmp/a.db", "EXTRA", 250
    )
    assert parse_dsn("sqlite:///rel.db?busy_timeout_ms=0").path == os.path.abspath("rel.db")
    assert parse_dsn("sqlite:////tmp/a%20b.db?synchronous=FULL").path == "/tmp/a b.db"


@pytest.mark.parametrize(
    "dsn, match",
    [
        ("sqlite:////tmp/a.db?journal_mode=DELETE", "unknown option 'journal_mode'"),
        ("sqlite:////tmp/a.db?synchronous=OFF", "synchronous must be"),
        ("sqlite:////tmp/a.db?synchronous=", "synchronous must be"),
        ("sqlite:////tmp/a.db?busy_timeout_ms=-1", "busy_timeout_ms must be"),
        ("sqlite:////tmp/a.db?busy_timeout_ms=1.5", "busy_timeout_ms must be"),
        ("sqlite:////tmp/a.db?busy_timeout_ms=", "busy_timeout_ms must be"),
        ("sqlite:////tmp/a.db?synchronous=FULL&synchronous=NORMAL", "repeated"),
        ("sqlite:////tmp/a.db?synchronous", "malformed"),
        ("sqlite:////tmp/a.db?timeout=5", "unknown option 'timeout'"),
        ("sqlite:///:memory:?synchronous=FULL", "name a file"),
        ("sqlite://host/a.db", "invalid SQLite DSN"),
    ],
)
def test_parse_dsn_refuses_bad_options(dsn: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse_dsn(dsn)
    with pytest.raises(ConfigurationError):
        Bus(dsn)


def test_dsn_options_and_keyword_arguments_must_agree(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'a.db'}?synchronous=NORMAL&busy_timeout_ms=1500"
    backend = SQLiteBackend(dsn)
    assert (backend.db.options.synchronous, backend.db.options.busy_timeout_ms) == ("NORMAL", 1500)
    assert backend.db.path == str(tmp_path / "a.db")
    same = SQLiteBackend(dsn, synchronous="normal", busy_timeout_ms=1500).db.options
    assert (same.synchronous, same.busy_timeout_ms) == ("NORMAL", 1500)
    with pytest.raises(ConfigurationError, match="synchronous is 'NORMAL' in the DSN"):
        SQLiteBackend(dsn, synchronous="FULL")
    with pytest.raises(ConfigurationError, match="busy_timeout_ms"):
        SQLiteBackend(dsn, busy_timeout_ms=30000)
    plain = SQLiteBackend(f"sqlite:///{tmp_path / 'b.db'}", synchronous="NORMAL").db.options
    assert (plain.synchronous, plain.busy_timeout_ms) == ("NORMAL", 30000)
    default = SQLiteBackend(f"sqlite:///{tmp_path / 'c.db'}").db.options
    assert (default.synchronous, default.busy_timeout_ms) == ("FULL", 30000)


@pytest.mark.parametrize("synchronous, level", [("FULL", 2), ("NORMAL", 1), ("EXTRA", 3)])
async def test_dsn_options_reach_the_connections(tmp_path: Path, synchronous: str, level: int) -> None:
    bus = Bus(f"sqlite:///{tmp_path / 'a.db'}?synchronous={synchronous}&busy_timeout_ms=1234", migrate=True)
    async with bus:
        backend = bus.backend
        assert isinstance(backend, SQLiteBackend)
        writer = backend.db.writer
        assert writer is not None

        async def pragma(name: str) -> object:
            return await writer.run(lambda c: c.execute(f"PRAGMA {name}").fetchone()[0])

        assert await pragma("synchronous") == level
        # SQLite waits in short slices; the backend keeps retrying up to its deadline.
        assert await pragma("busy_timeout") == min(1234, BUSY_SLICE_MS)
        assert backend.db.options.busy_timeout_ms == 1234
        assert await pragma("journal_mode") == "wal"
        report = await bus.status()
        assert report.events == 0


def test_cli_takes_options_in_the_dsn_and_refuses_unknown_ones(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EVENTBUS_DSN"}
    good = f"sqlite:///{tmp_path / 'cli.db'}?synchronous=NORMAL&busy_timeout_ms=2000"
    for args in (["migrate"], ["publish", "x.y", '{"a": 1}'], ["status", "--json"]):
        result = subprocess.run(
            [EVENTBUS, "--dsn", good, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stderr
    assert '"events":1' in result.stdout.replace(" ", "")
    bad = f"sqlite:///{tmp_path / 'cli.db'}?synchronus=NORMAL"
    result = subprocess.run(
        [EVENTBUS, "--dsn", bad, "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0
    assert "ConfigurationError" in result.stderr and "unknown option 'synchronus'" in result.stderr
    assert "Traceback" not in result.stderr
