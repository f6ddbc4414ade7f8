"""One PostgreSQL session of the bus: the pool, the held publish connection, the queries.

Every port object of :class:`~eventbus.backends.postgres.PostgresBackend`
takes the same :class:`PgDb` and reaches the database only through it:
``conn()`` and ``tx()`` for a pooled connection, ``held()`` for the
connection kept aside for lone publishes, ``publish_on()`` to append events
inside any of them. Driver errors leave it as :mod:`eventbus.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import anyio
import asyncpg

from ..._priority import DEFAULT_PRIORITY_STEP_SECONDS
from ...errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    EventBusError,
    PublishError,
    SchemaNotMigrated,
)
from ...types import EventId, PublishResult
from .._sql import load_queries, query_names, quote_schema, validate_schema
from ..ports import LockWaitExceeded, OutgoingEvent
from ._kept import publish_kept

log = logging.getLogger("eventbus.postgres")

__all__ = [
    "HELD_LOCK_WAIT_MS",
    "STATEMENT_LIFETIME_SECONDS",
    "PgDb",
    "check_dsn",
    "notify_channel",
    "resolve_results",
    "translate_errors",
]

_UNAVAILABLE = (
    OSError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a pooled connection left mid-operation by a server restart
)

# What a transaction pooler does to named prepared statements: another
# client's statement of the same name on the server connection it was handed,
# or none of its own.
_POOLED_STATEMENT = (
    asyncpg.exceptions.DuplicatePreparedStatementError,
    asyncpg.exceptions.InvalidSQLStatementNameError,
)

STATEMENT_CACHE_SIZE = 100  # asyncpg's default

# How long a pooled connection keeps a prepared statement before preparing it
# again. PostgreSQL settles on a generic plan after five executions and keeps
# it until the table's statistics change; where autovacuum is off or behind, a
# plan made while the tables were nearly empty (a sequential scan of
# deliveries for the claim's update, a hash join to events) stays in use as
# they grow, and the claim slowed from 12,000/s to 3,500/s within 30 s here.
# Preparing again costs one round trip per statement and connection per period.
STATEMENT_LIFETIME_SECONDS = 30

# How long a publish on the held connection waits for a row lock (a key that
# another open transaction inserted) before it gives up, publishing nothing,
# so that one blocked key never holds up the publishes queued behind it; the
# caller sends it again on a pooled connection, which waits as long as it
# takes. Set by the statement itself for its own transaction (set_config(…,
# true)): no session state, nothing to reset, the same behind a pooler.
HELD_LOCK_WAIT_MS = 500


@contextlib.contextmanager
def translate_errors(operation: str = "the operation", timeout: float | None = None) -> Iterator[None]:
    """Map driver errors to eventbus errors, keeping the cause.

    ``operation`` names what was being done, for the message of a timeout
    (``TimeoutError`` is an ``OSError``, so it is told apart first).
    """
    try:
        yield
    except EventBusError:
        raise
    except (asyncpg.exceptions.UndefinedTableError, asyncpg.exceptions.InvalidSchemaNameError) as exc:
        raise SchemaNotMigrated(f"{SchemaNotMigrated.__doc__} ({exc})") from exc
    except _POOLED_STATEMENT as exc:
        raise BackendError(
            f"PostgreSQL refused the operation: {exc.message}; is a transaction pooler "
            "(PgBouncer pool_mode = transaction) in front? Add ?pooler=transaction to the DSN"
        ) from exc
    except asyncpg.exceptions.ProtocolViolationError as exc:
        if "startup parameter" not in str(exc):
            raise BackendError(f"PostgreSQL refused the operation: {exc}") from exc
        raise ConfigurationError(
            f"the server refused the connection: {exc}; is a pooler (PgBouncer) in front? "
            "Add ?pooler=transaction (or ?pooler=session) to the DSN"
        ) from exc
    except TimeoutError as exc:
        within = f" within {timeout:g}s" if timeout is not None else ""
        raise BackendUnavailable(f"PostgreSQL timed out: {operation} got no answer{within}") from exc
    except _UNAVAILABLE as exc:
        raise BackendUnavailable(f"PostgreSQL is unavailable: {exc or type(exc).__name__}") from exc
    except asyncpg.PostgresError as exc:
        raise BackendError(f"PostgreSQL refused the operation: {exc}") from exc


def notify_channel(schema: str) -> str:
    """The NOTIFY channel of a schema: ``eventbus_<schema>``, kept within PostgreSQL's 63 bytes.

    A longer name keeps a prefix of the schema and adds a hash of all of it,
    so every valid schema has its own channel.
    """
    channel = f"eventbus_{schema}"
    if len(channel) <= 63:
        return channel
    digest = hashlib.sha256(schema.encode()).hexdigest()[:16]
    return f"{channel[:46]}_{digest}"


def check_dsn(dsn: str) -> str:
    """Refuse a PostgreSQL DSN whose host or port cannot be parsed (one host or several)."""
    try:
        netloc = urllib.parse.urlsplit(dsn).netloc
    except ValueError as exc:
        raise ConfigurationError(f"invalid PostgreSQL DSN: {exc}") from exc
    for host in netloc.rpartition("@")[2].split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if host.startswith("[") and "]" not in host:
            raise ConfigurationError(f"invalid PostgreSQL DSN: unclosed [ in host {host!r}")
        number = port.rpartition(":")[2] if ":" in port else "5432"
        if not number.isdigit():
            raise ConfigurationError(f"invalid PostgreSQL DSN: port of {host!r} is not a number")
        if not 0 < int(number) < 65536:
            raise ConfigurationError(f"invalid PostgreSQL DSN: port of {host!r} is not from 1 to 65535")
    return dsn


async def _keep_session(conn: Any) -> None:
    """Pool reset hook: nothing to undo.

    The backend changes no session state on pooled connections (no SET, no
    LISTEN, only transaction-scoped advisory locks), and asyncpg still rolls
    back a transaction left open, which ends those locks too. The default
    reset query costs a round trip on every release: about a third of a
    single publish.
    """


_KEPT_FOR_THE_WORKER = 2
"""Pooled connections transactional handlers leave to everything else (see ``PgDb.handler_slots``)."""

DEAD_CLIENT_SECONDS = 10.0
"""How long the server keeps a session whose client stopped answering (see :func:`session_settings`)."""


PLAN_SETTINGS = {"plan_cache_mode": "force_custom_plan", "jit": "off"}
"""What the append-only path's sessions plan with. Every ring statement names its slots as a
parameter, and a generic plan of one would lock every slot's partitions, so a slot's TRUNCATE
would wait behind any claim; and a read over the ring's view expands 35 partitions, most of them
empty and never analyzed, whose default estimates put an inspection read of six rows past
``jit_above_cost`` (compiling it took 1.8 s, against 0.002 s without JIT)."""


def session_settings(dead_client_seconds: float | None) -> dict[str, str]:
    """Settings sent when each pooled connection starts, so the server ends a dead client's session.

    A worker whose host is cut off (a network partition, a host that froze or
    lost power) can leave a transaction open on the server between two
    statements, holding the row locks of the deliveries it was completing:
    another worker's lease recovery skips locked rows, so that work would wait
    for the operating system's TCP keepalive, two hours by default. Within
    about ``dead_client_seconds`` instead, the server ends such a session: idle
    inside a transaction that long (``idle_in_transaction_session_timeout``; the
    bus never leaves one idle for more than a round trip), or not answering
    keepalive probes or acknowledging data that long (``tcp_keepalives_*``,
    ``tcp_user_timeout``). ``None`` leaves the server's own settings.
    """
    if dead_client_seconds is None:
        return {}
    if not dead_client_seconds >= 1:
        raise ConfigurationError(
            f"dead_client_seconds must be at least 1 (or None), got {dead_client_seconds}"
        )
    seconds = int(dead_client_seconds)
    return {
        "idle_in_transaction_session_timeout": f"{seconds}s",
        "tcp_user_timeout": str(seconds * 1000),
        "tcp_keepalives_idle": str(max(1, seconds // 2)),
        "tcp_keepalives_interval": str(max(1, seconds // 4)),
        "tcp_keepalives_count": "2",
    }


_PER_STORE = {
    **dict.fromkeys(("find_deliveries", "find_deliveries_dead", "find_deliveries_stuck",
                     "find_deliveries_retrying"), "newest"),
    **dict.fromkeys(("delivery_ids", "delivery_ids_dead", "delivery_ids_stuck",
                     "delivery_ids_retrying"), "oldest"),
    **dict.fromkeys(("count_deliveries", "count_deliveries_dead", "count_deliveries_stuck",
                     "count_deliveries_retrying"), "count"),
}  # fmt: skip
"""The filtered lists, id walks and capped counts: on the append-only path the same query runs
once per store (see :func:`_per_store`)."""


_CAPPED = re.compile(r"(?:--[^\n]*\n)*SELECT count\(\*\) FROM \((.*)\) capped", re.DOTALL)
"""A capped count of inspect.sql (its comment, then ``SELECT count(*) FROM (...) capped``):
the rows it counts."""


def _per_store(kind: str, copies: list[str]) -> str:
    """One query from its copies on each store (deliveries, the ring's rows, the completed
    outcomes: ``ring_rows_ready``, ``ring_rows_log``), each planned on its own store's indexes.

    A list (``newest``: ``$16`` rows by id descending) or an id walk (``oldest``: ascending)
    takes each copy's first ``$16`` rows and the first ``$16`` of those; a count (``count``:
    capped at ``$15``) counts the rows each copy would count, one store after the other, no
    further than ``$15`` in all.
    """
    if kind == "count":  # the capped rows of each store in turn: the cap stops the first that fills it
        # The outcome log first: on this path it holds most deliveries, and a count that its rows
        # fill is then one walk of the log (deliveries, much smaller than the events then, would be
        # hashed and every event read to find the rows to count).
        rows = "\nUNION ALL\n".join(f"({_CAPPED.fullmatch(c).group(1)})" for c in copies[::-1])  # type: ignore[union-attr]
        return f"SELECT count(*) FROM (\n{rows}\nLIMIT $15\n) capped"
    union = "\nUNION ALL\n".join(f"({c})" for c in copies)
    order = "u.id DESC" if kind == "newest" else "u.id"
    return f"SELECT * FROM (\n{union}\n) u ORDER BY {order} LIMIT $16"


class PgDb:
    """The pool of one schema, the connection held for lone publishes, and the named queries."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        min_pool_size: int = 1,
        max_pool_size: int = 10,
        command_timeout: float = 60.0,
        statement_lifetime_seconds: int = STATEMENT_LIFETIME_SECONDS,
        dead_client_seconds: float | None = DEAD_CLIENT_SECONDS,
        statement_cache: bool = True,
        transaction_pooler: bool = False,
    ) -> None:
        self.dsn = check_dsn(dsn)
        self.server_settings = session_settings(dead_client_seconds)
        self.dead_client_seconds = dead_client_seconds
        """The dead-client guard sent with each session (None: the server's own settings)."""
        self.schema = validate_schema(schema)
        self.channel = notify_channel(self.schema)
        """The NOTIFY channel every wake-up of this schema goes through."""
        self.q = load_queries("postgres", self.schema)
        self.command_timeout = command_timeout
        self.priority_step = DEFAULT_PRIORITY_STEP_SECONDS
        """The seconds of waiting a priority level is worth (priority_wait is priority times this)."""
        self.append_only = False
        """Whether publishes fan ordinary first runs out into the ring (see :mod:`.ring`)."""
        self.opener: Callable[[], Awaitable[object]] = self._no_check
        """What :meth:`open` runs once: the backend's schema check or its migration."""
        self.ready = False
        self._pool_size = (min_pool_size, max_pool_size)
        self.handler_slots = anyio.Semaphore(max(1, max_pool_size - _KEPT_FOR_THE_WORKER))
        """Transactional handlers running at once: each holds a pooled connection for its duration,
        and a few connections stay free for the worker's claims, results and lease renewals."""
        self._statement_lifetime = statement_lifetime_seconds
        self.statement_cache = statement_cache
        """Whether connections keep named prepared statements (off behind a transaction pooler)."""
        self.transaction_pooler = transaction_pooler
        """Whether a transaction pooler is in front: no session outlives a transaction."""
        self._pool: asyncpg.Pool | None = None
        self.held_conn: Any = None
        """The pooled connection kept aside for lone publishes (see :meth:`held`), if taken."""
        self._held_lock = asyncio.Lock()
        self._session_setup: str | None = None
        """Run on each new pooled connection (the plan settings behind a session pooler)."""
        self._check_plan_settings = False
        """Whether the plan settings are checked once, as the role's (behind a transaction pooler)."""

    def take_append_only(self, pooler: str = "none") -> None:
        """Take the append-only hot path (see :mod:`.ring`): publishes fan ordinary first runs out
        into the ring, every statement is planned for its parameters, and the reads of the
        deliveries (inspection, the queue samples, whether a schedule's firing is done) read
        ``delivery_rows``, the view that shows the ring's deliveries beside the others; those
        that count every delivery or walk them by id read each store on its own instead
        (``ring_reads.sql``, :func:`_per_store`): the planner reads the outcome log's branch of
        the view whole.

        The plan settings (:data:`PLAN_SETTINGS`) go with each connection's start when the bus
        is direct; a pooler refuses startup parameters, so behind a session pooler each
        connection sets them once (its server session is its own for its life), and behind a
        transaction pooler, whose server sessions are shared, they must be the role's: the bus
        checks and says so once if they are not."""
        self.append_only = True
        if pooler == "none":
            self.server_settings.update(PLAN_SETTINGS)
        elif pooler == "session":
            self._session_setup = "; ".join(f"SET {k} = {v}" for k, v in PLAN_SETTINGS.items())
        else:
            self._check_plan_settings = True
        table = re.compile(re.escape(quote_schema(self.schema)) + r"\.deliveries\b")
        view = quote_schema(self.schema) + ".delivery_rows"
        stores = [
            quote_schema(self.schema) + ".deliveries",
            f"({self.q['ring_rows_ready']})",
            f"({self.q['ring_rows_log']})",
        ]
        reads = {"rollup_sample", "schedule_work_open", "occurrences_list"}
        for name in query_names("postgres", "inspect.sql") | reads:
            if name in _PER_STORE:
                copies = [table.sub(store.replace("\\", "\\\\"), self.q[name]) for store in stores]
                self.q[name] = _per_store(_PER_STORE[name], copies)
            elif name in self.q:  # not a fragment: those are written into their queries
                self.q[name] = table.sub(view, self.q[name])
        # Counts of every delivery and the newest window: each store counted or walked on its own.
        self.q["status"] = self.q["ring_status"]
        self.q["status_recent"] = self.q["ring_status_recent"]
        self.q["health_completed_recent"] = self.q["ring_health_completed_recent"]

    async def _no_check(self) -> None:
        self.ready = True

    # -- connections -------------------------------------------------------

    async def open(self) -> None:
        """Run the opener (schema check or migration) unless it already succeeded."""
        if not self.ready:
            await self.opener()

    async def pool(self) -> asyncpg.Pool:
        """The pool, created on first use."""
        if self._pool is None:
            with translate_errors("connecting", self.command_timeout):
                try:
                    self._pool = await asyncpg.create_pool(
                        self.dsn,
                        min_size=self._pool_size[0],
                        max_size=self._pool_size[1],
                        command_timeout=self.command_timeout,
                        reset=_keep_session,
                        statement_cache_size=self._statement_cache_size,
                        max_cached_statement_lifetime=self._statement_lifetime,
                        server_settings=self.server_settings,
                        init=self._setup_session if self._session_setup else None,
                    )
                except ValueError as exc:  # the DSN (asyncpg parses it here)
                    raise ConfigurationError(f"invalid PostgreSQL DSN: {exc}") from exc
                if self._check_plan_settings:
                    self._check_plan_settings = False
                    await self._warn_plan_settings(self._pool)
        return self._pool

    async def _setup_session(self, conn: Any) -> None:
        assert self._session_setup is not None
        await conn.execute(self._session_setup)

    @staticmethod
    async def _warn_plan_settings(pool: asyncpg.Pool) -> None:
        """Say once, naming the fix, when the role's settings are not the plan settings."""
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])", list(PLAN_SETTINGS)
            )
        now = {r["name"]: r["setting"] for r in rows}
        wrong = {k: v for k, v in PLAN_SETTINGS.items() if now.get(k) != v}
        if wrong:
            fix = "; ".join(f"ALTER ROLE <role> SET {k} = {v}" for k, v in wrong.items())
            log.warning(
                "the append-only path behind a transaction pooler plans with the role's settings, "
                "and they are not the ones it needs (%s): run %s (otherwise a slot's TRUNCATE may "
                "wait behind claims planned for every slot)",
                ", ".join(f"{k} is {now.get(k)}" for k in wrong),
                fix,
            )

    @property
    def _statement_cache_size(self) -> int:
        """asyncpg's statement cache: named statements re-prepared every period, or none at all.

        Without the cache asyncpg sends each query as the unnamed statement,
        parsed again with its Bind and Execute in one message group, so a
        transaction pooler may hand every query to another server connection
        (one more round trip per query: the Describe before the Bind).
        """
        return STATEMENT_CACHE_SIZE if self.statement_cache else 0

    @contextlib.asynccontextmanager
    async def pool_conn(self, operation: str = "a query") -> AsyncIterator[Any]:
        """A pooled connection, without the schema check of :meth:`open`."""
        pool = await self.pool()
        with translate_errors(operation, self.command_timeout):
            async with pool.acquire() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def conn(self, operation: str = "a query") -> AsyncIterator[Any]:
        """A pooled connection of an opened backend; ``operation`` names it in a timeout."""
        await self.open()
        async with self.pool_conn(operation) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def tx(self, operation: str = "a transaction") -> AsyncIterator[Any]:
        """As :meth:`conn`, inside a transaction that commits when the block ends normally."""
        async with self.conn(operation) as conn, conn.transaction():
            yield conn

    async def allow_idle(self, conn: Any, limit: str) -> None:
        """Let the transaction open on ``conn`` stay idle for ``limit`` (a PostgreSQL interval)."""
        with translate_errors("a transactional handler", self.command_timeout):
            await conn.execute(self.q["transaction_idle_limit"], limit)

    # -- the held publish connection ---------------------------------------

    @property
    def holds_one(self) -> bool:
        """Whether a connection is kept aside at all: a pool of one keeps none (all would wait)."""
        return self._pool_size[1] >= 2

    @property
    def held_busy(self) -> bool:
        """Whether a publish is running on the held connection now."""
        return self._held_lock.locked()

    @contextlib.asynccontextmanager
    async def held(self, operation: str) -> AsyncIterator[Any]:
        """The held connection, one caller at a time; it stays a member of the pool.

        A pool acquire and release cost about as much client time as a lone
        publish's statement. A ``publish_on(…, bounded=True)`` on it that waits
        ``HELD_LOCK_WAIT_MS`` for a row lock raises :class:`LockWaitExceeded`
        (the connection stays). One that fails for any reason but the database's
        refusal of the statement goes back to the pool (which closes or resets
        it) and the next caller takes another.
        """
        async with self._held_lock:
            conn = self.held_conn or await self._take_held(operation)
            try:
                with translate_errors(operation, self.command_timeout):
                    try:
                        yield conn
                    except asyncpg.exceptions.LockNotAvailableError as exc:
                        raise LockWaitExceeded(
                            f"{operation} waited {HELD_LOCK_WAIT_MS} ms for a row lock another "
                            "transaction holds; nothing was published"
                        ) from exc
            except BackendUnavailable:
                await self._release_held()
                raise
            except EventBusError:  # the database refused the statement: the connection is sound
                raise
            except BaseException:  # cancelled mid-statement: the pool waits out the cancellation
                await self._release_held()
                raise

    async def _take_held(self, operation: str) -> Any:
        await self.open()
        pool = await self.pool()
        with translate_errors(operation, self.command_timeout):
            self.held_conn = await pool.acquire()
        return self.held_conn

    async def _release_held(self) -> None:
        conn, self.held_conn = self.held_conn, None
        pool = self._pool
        if conn is not None and pool is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await pool.release(conn)

    async def aclose(self) -> None:
        """Hand back the held connection (after a publish in flight) and close the pool."""
        with anyio.move_on_after(10):  # a publish in flight on the held connection finishes first
            async with self._held_lock:
                await self._release_held()
        await self._release_held()
        pool, self._pool = self._pool, None
        self.ready = False
        if pool is not None:
            try:
                with anyio.move_on_after(10):
                    await pool.close()
            finally:
                pool.terminate()  # also when the caller gave up waiting for the graceful close

    # -- publishing inside a connection --------------------------------------

    async def publish_on(
        self, conn: Any, events: Sequence[OutgoingEvent], *, bounded: bool = False
    ) -> list[PublishResult]:
        """Append ``events`` and fan them out on ``conn`` (in its transaction, if any).

        ``bounded``: the statements, in a transaction of their own, wait at most
        ``HELD_LOCK_WAIT_MS`` for a row lock (then PostgreSQL refuses them).
        """
        lock_wait = f"{HELD_LOCK_WAIT_MS}ms" if bounded else None
        if any(e.keep_key for e in events):  # once=True: see _kept
            kept = (self.q["kept_keys"], self.q["keep_keys"])

            async def plain(c: Any, evs: Sequence[OutgoingEvent]) -> list[PublishResult]:
                return await self._publish_plain(c, evs, lock_wait)

            return await publish_kept(conn, kept, events, plain)
        return await self._publish_plain(conn, events, lock_wait)

    async def _publish_plain(
        self, conn: Any, events: Sequence[OutgoingEvent], lock_wait: str | None = None
    ) -> list[PublishResult]:
        if not events:
            return []
        inserted = await self._insert(conn, events, lock_wait)
        if len(inserted) == len(events):  # nothing skipped: every event is new
            return [PublishResult(EventId(inserted[i]), duplicate=False) for i in range(len(events))]
        batch_keys = {(e.event_type, e.key) for i, e in enumerate(events) if i in inserted}
        missing = [
            e
            for i, e in enumerate(events)
            if e.key is not None and i not in inserted and (e.event_type, e.key) not in batch_keys
        ]
        known: dict[tuple[str, str], int] = {}
        if missing:
            found = await conn.fetch(
                self.q["existing_ids"], [e.event_type for e in missing], [e.key for e in missing]
            )
            known = {(r["event_type"], r["key"]): r["id"] for r in found}
        return resolve_results(events, inserted, known)

    async def _insert(
        self, conn: Any, events: Sequence[OutgoingEvent], lock_wait: str | None
    ) -> dict[int, int]:
        """Insert and fan out; map input index -> new event id (a taken key has none)."""
        if len(events) > 1:
            versions = [e.event_version for e in events]
            priorities = [e.priority for e in events]
            rows = await conn.fetch(
                self.q["publish"], *_columns(events), self.channel, lock_wait, versions,
                priorities, self.priority_step, self.append_only,
            )  # fmt: skip
            return {r["ord"] - 1: r["id"] for r in rows}
        e = events[0]
        new_id = await conn.fetchval(
            self.q["publish_one"],
            e.event_type,
            e.key,
            e.payload,
            e.headers_json,
            e.delay_seconds,
            e.correlation_id,
            e.causation_id,
            e.ordering_key,
            self.channel,
            lock_wait,
            e.event_version,
            e.priority,
            self.priority_step,
            self.append_only,
        )
        return {} if new_id is None else {0: new_id}


def _columns(events: Sequence[OutgoingEvent]) -> tuple[list[Any], ...]:
    return (
        [e.event_type for e in events],
        [e.key for e in events],
        [e.payload for e in events],
        [e.headers_json for e in events],
        [e.delay_seconds for e in events],
        [e.correlation_id for e in events],
        [e.causation_id for e in events],
        [e.ordering_key for e in events],
    )


def resolve_results(
    events: Sequence[OutgoingEvent], inserted: dict[int, int], existing: dict[tuple[str, str], int]
) -> list[PublishResult]:
    """Results in input order, from the ids inserted by input index and the keys taken before.

    The first occurrence of a key in the batch is the one inserted; later ones
    in the same batch, and keys taken by an earlier publish, are duplicates.
    """
    results: list[PublishResult] = []
    for index, event in enumerate(events):
        new_id = inserted.get(index)
        ident = (event.event_type, event.key) if event.key is not None else None
        if new_id is not None:
            if ident is not None:
                existing[ident] = new_id
            results.append(PublishResult(EventId(new_id), duplicate=False))
        elif ident is not None and ident in existing:
            results.append(PublishResult(EventId(existing[ident]), duplicate=True))
        else:
            raise PublishError(
                f"event {event.event_type}/{event.key} conflicted with a row this "
                "transaction cannot see (a concurrent delete, or REPEATABLE READ)"
            )
    return results
