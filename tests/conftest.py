"""Fixtures: every contract test runs on PostgreSQL and on a SQLite file.

PostgreSQL comes from ``EVENTBUS_TEST_DSN`` when set; otherwise a throwaway
server is started from the local binaries. It is never skipped. Each test
process (each pytest-xdist worker) gets a database of its own on that server,
dropped when it ends, and each test a fresh schema in it (PostgreSQL) or a
fresh file (SQLite). ``--backend`` narrows the backend-parametrised tests to
one backend (tests/contract/README.md).

A third kind, ``postgres-pgbouncer``, reaches the same server through a
PgBouncer in transaction pooling mode started by the run (the bus opened with
``?pooler=transaction``). By default only the tests marked ``pooler`` run on it
(the rule: tests/contract/README.md); every backend test does when
``--backend postgres-pgbouncer`` is given. A fourth,
``postgres-pgbouncer-session`` (PgBouncer in session mode, ``?pooler=session``),
runs only when named with ``--backend``.

A fifth, ``postgres-append-only``, is PostgreSQL with the append-only hot path
(``Bus(dsn, append_only=True)``, eventbus/backends/postgres/ring.py). The tests
marked ``append_only`` run on it by default; every backend test does when
``--backend postgres-append-only`` is given.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from eventbus import Bus

from .support.databases import drop_schema, worker_database
from .support.pgbouncer import PgBouncer, running_pgbouncer
from .support.pgserver import PgServer
from .support.templates import seed_postgres, seed_sqlite

BACKENDS = ["postgres", "sqlite"]
POOLED = "postgres-pgbouncer"
"""PostgreSQL through PgBouncer in transaction mode (``?pooler=transaction``)."""
POOLED_SESSION = "postgres-pgbouncer-session"
"""PostgreSQL through PgBouncer in session mode (``?pooler=session``): only with ``--backend``."""
APPEND_ONLY = "postgres-append-only"
"""PostgreSQL with the append-only hot path (``Bus(dsn, append_only=True)``)."""
APPEND_ONLY_MARK = "append_only"
POOLER_MARK = "pooler"
"""The mark of a backend test that also runs through PgBouncer without ``--backend``: one whose
code behaves differently behind a transaction pooler (tests/contract/README.md)."""
# Folders and files whose tests start first, so the slowest (real processes,
# kills, restarts, a browser) spread over the xdist workers instead of queuing
# at the end.
FIRST = (
    "tests/faults/",
    "tests/integration/",
    "tests/features/web/test_browser.py",
    "tests/features/workflows/test_processes.py",
    "tests/features/schedules/test_workers.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        action="append",
        choices=[*BACKENDS, POOLED, POOLED_SESSION, APPEND_ONLY],
        help="run the backend tests on this backend only (repeatable; default: every backend)",
    )


def _backend_of(item: pytest.Item) -> str | None:
    """The backend a test runs on: its ``backend_kind``, PgBouncer for a pooler test, else PostgreSQL
    for a PostgreSQL-only test."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "backend_kind" in callspec.params:
        return str(callspec.params["backend_kind"])
    fixtures = getattr(item, "fixturenames", ())
    if "pgbouncer" in fixtures or "pgbouncer_session" in fixtures:
        return POOLED
    if "pg_dsn" in fixtures:
        return "postgres"
    return None


def _kinds(config: pytest.Config, definition: pytest.Item) -> list[str]:
    chosen = config.getoption("backend") or ()
    pooled = POOLED in chosen or definition.get_closest_marker(POOLER_MARK) is not None
    ring = APPEND_ONLY in chosen or definition.get_closest_marker(APPEND_ONLY_MARK) is not None
    return [
        *BACKENDS,
        *([POOLED] if pooled else []),
        *([POOLED_SESSION] if POOLED_SESSION in chosen else []),
        *([APPEND_ONLY] if ring else []),
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``backend_kind`` over the backends, unless the test names its own."""
    if "backend_kind" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        if "backend_kind" in str(mark.args[0] if mark.args else mark.kwargs.get("argnames", "")):
            return
    metafunc.parametrize("backend_kind", _kinds(metafunc.config, metafunc.definition), indirect=True)


def _start_rank(item: pytest.Item) -> int:
    path = item.nodeid
    return next((i for i, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = config.getoption("backend")
    if chosen:
        kept = [i for i in items if _backend_of(i) in (None, *chosen)]
        if len(kept) < len(items):
            kept_ids = {id(i) for i in kept}
            config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept_ids])
            items[:] = kept
    items.sort(key=_start_rank)  # stable: collection order within each rank


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """The PostgreSQL server of this run: ``EVENTBUS_TEST_DSN``, or a throwaway one."""
    dsn = os.environ.get("EVENTBUS_TEST_DSN")
    if dsn:
        yield dsn
        return
    server = PgServer().start()
    try:
        yield server.dsn
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def pg_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A database of this test process's own on the run's server (see support/databases.py)."""
    with worker_database(pg_server_dsn) as dsn:
        yield dsn


@pytest.fixture
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def pgbouncer(pg_server_dsn: str) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction pooling mode in front of the run's server, for the whole run."""
    with running_pgbouncer(pg_server_dsn, "transaction") as bouncer:
        yield bouncer


@pytest.fixture(scope="session")
def pgbouncer_session(pg_server_dsn: str) -> Iterator[PgBouncer]:
    """A PgBouncer in session pooling mode in front of the run's server, for the whole run."""
    with running_pgbouncer(pg_server_dsn, "session") as bouncer:
        yield bouncer


class Target:
    """Where a test's bus lives: a DSN plus, on PostgreSQL, its own schema."""

    def __init__(
        self,
        kind: str,
        dsn: str,
        schema: str | None,
        direct_dsn: str | None = None,
        options: dict[str, object] | None = None,
    ) -> None:
        self.kind = kind
        self.options = options or {}
        """Options every bus of the target is opened with (``append_only``)."""
        self.dsn = dsn
        self.schema = schema
        self.direct_dsn = direct_dsn or dsn
        """A DSN straight to the database, for a test's own checks (``dsn`` may go through a pooler)."""

    def env(self) -> dict[str, str]:
        env = dict(os.environ, EVENTBUS_DSN=self.dsn)
        env.setdefault("EVENTBUS_MAX_POOL_SIZE", "4")  # see tests/support/processes.py
        if self.options.get("append_only"):
            env["EVENTBUS_APPEND_ONLY"] = "1"
        if self.schema:
            env["EVENTBUS_SCHEMA"] = self.schema
        return env

    def bus(self, **options: object) -> Bus:
        return Bus(self.dsn, schema=self.schema, **{**self.options, **options})  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def open_target(
    backend_kind: str, folder: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Target]:
    """An empty target of ``backend_kind``: a SQLite file in ``folder``, or a fresh PostgreSQL schema."""
    if backend_kind == "sqlite":
        yield Target("sqlite", f"sqlite:///{folder / 'bus.db'}", None)
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    if backend_kind in (POOLED, POOLED_SESSION):
        bouncer: PgBouncer = request.getfixturevalue(
            "pgbouncer" if backend_kind == POOLED else "pgbouncer_session"
        )
        pooled = f"{bouncer.dsn_for(dsn)}?pooler={bouncer.mode}"
        yield Target("postgres", pooled, schema, direct_dsn=dsn)
    elif backend_kind == APPEND_ONLY:
        yield Target("postgres", dsn, schema, options={"append_only": True})
    else:
        yield Target("postgres", dsn, schema)
    await drop_schema(dsn, schema)


@pytest.fixture
async def target(backend_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    async with open_target(backend_kind, tmp_path, request) as t:
        yield t


@pytest.fixture
async def pg_target(pg_dsn: str) -> AsyncIterator[Target]:
    """A PostgreSQL-only target, for tests of PostgreSQL features."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield Target("postgres", pg_dsn, schema)
    await drop_schema(pg_dsn, schema)


BusFactory = Callable[..., Awaitable[Bus]]


@pytest.fixture(scope="session")
def sqlite_template_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this test process keeps its migrated SQLite file (support/templates.py)."""
    return tmp_path_factory.mktemp("sqlite-template")


async def seed_target(target: Target, request: pytest.FixtureRequest) -> None:
    """Give an empty target a migrated store by copy (support/templates.py)."""
    if target.schema is None:
        await seed_sqlite(target.dsn, request.getfixturevalue("sqlite_template_folder"))
    else:
        await seed_postgres(target.direct_dsn, target.schema)


@pytest.fixture
async def make_bus(target: Target, request: pytest.FixtureRequest) -> AsyncIterator[BusFactory]:
    """Build migrated buses on the test's target; all are closed afterwards.

    The first one finds the target seeded with a migrated store (a copy, not a
    migration from nothing: support/templates.py); each still runs ``migrate``.
    """
    buses: list[Bus] = []

    async def factory(**options: object) -> Bus:
        if not buses:
            await seed_target(target, request)
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
