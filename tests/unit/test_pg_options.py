"""The bus's own options of a PostgreSQL DSN: pooler, listen_dsn, poll interval."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from eventbus import Bus
from eventbus.backends.postgres._dsn import pg_options
from eventbus.errors import ConfigurationError

DIRECT = "postgresql://u@db:5432/app"
POOLED = "postgresql://u@pool:6432/app"


def test_bus_options_leave_the_dsn_before_the_driver_sees_it() -> None:
    opts = pg_options(f"{POOLED}?sslmode=disable&pooler=transaction&poll_interval_seconds=0.25")
    assert opts.dsn == f"{POOLED}?sslmode=disable"
    assert opts.pooler == "transaction" and opts.poll_interval_seconds == 0.25
    assert not opts.statement_cache and opts.listen_target is None  # poll-only
    assert pg_options(DIRECT).dsn == DIRECT and pg_options(DIRECT).statement_cache


def test_listen_dsn_from_the_dsn_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded = "postgresql%3A%2F%2Fu%40db%3A5432%2Fapp"
    assert pg_options(f"{POOLED}?pooler=transaction&listen_dsn={encoded}").listen_target == DIRECT
    assert pg_options(POOLED, pooler="transaction", listen_dsn=DIRECT).listen_target == DIRECT
    monkeypatch.setenv("EVENTBUS_LISTEN_DSN", DIRECT)
    assert pg_options(POOLED, pooler="transaction").listen_target == DIRECT


def test_session_pooler_and_prepared_statement_support_keep_the_cache() -> None:
    assert pg_options(POOLED, pooler="session").statement_cache
    assert pg_options(POOLED, pooler="session").listen_target == POOLED  # LISTEN holds its session
    supported = pg_options(f"{POOLED}?pooler=transaction&pooler_prepared_statements=true")
    assert supported.statement_cache and supported.listen_target is None


@pytest.mark.parametrize(
    ("dsn", "arguments", "message"),
    [
        (f"{POOLED}?pooler=statement", {}, "pooler must be one of none, session, transaction"),
        (f"{POOLED}?pooler=transaction", {"pooler": "session"}, "give it once"),
        (f"{POOLED}?pooler=session&pooler=transaction", {}, "is repeated"),
        (f"{POOLED}?pooler_prepared_statements=maybe", {}, "must be true or false"),
        (f"{POOLED}?poll_interval_seconds=0", {}, "above zero"),
        (f"{POOLED}?poll_interval_seconds=soon", {}, "number of seconds"),
        (POOLED, {"listen_dsn": "mysql://db/app"}, "postgresql:// DSN"),
        (POOLED, {"listen_dsn": f"{DIRECT}?pooler=transaction"}, "direct connection"),
    ],
)
def test_bad_options_are_refused_with_the_reason(dsn: str, arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Bus(dsn, **arguments)


def test_a_bad_pooler_on_the_command_line_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "eventbus", "--dsn", f"{POOLED}?pooler=transation", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "pooler must be one of" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_the_pool_size_comes_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from eventbus.backends.postgres import PostgresBackend

    dsn = "postgresql://postgres@127.0.0.1:5432/test"
    monkeypatch.setenv("EVENTBUS_MAX_POOL_SIZE", "3")
    assert PostgresBackend(dsn).db._pool_size == (1, 3)
    assert PostgresBackend(dsn, max_pool_size=7).db._pool_size == (1, 7)
    for bad in ("0", "many"):
        monkeypatch.setenv("EVENTBUS_MAX_POOL_SIZE", bad)
        with pytest.raises(ConfigurationError, match="EVENTBUS_MAX_POOL_SIZE"):
            PostgresBackend(dsn)
