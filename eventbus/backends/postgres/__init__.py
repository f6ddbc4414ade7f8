"""PostgreSQL backend on asyncpg: SKIP LOCKED claims and LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
import os
import socket
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

import anyio
import asyncpg

from ...errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    EventBusError,
    NotFound,
    PublishError,
    RegistrationError,
    SchemaNotMigrated,
)
from ...types import (
    AttemptRecord,
    DeadLetterFilter,
    DeliveryDetail,
    DeliveryId,
    EventId,
    PublishResult,
    StatusReport,
    StatusRow,
    SubscriptionInfo,
    WorkerRow,
)
from .. import _migrations as migrations
from .._spacing import Spaced
from .._sql import load_queries, quote_schema, validate_schema
from ..base import (
    ClaimedDelivery,
    Completion,
    Failure,
    LeaseKey,
    OutgoingEvent,
    SubscriptionSpec,
    decode_headers,
    warn_not_active,
)
from ._inspect import PostgresInspection
from ._listener import PostgresListener
from ._observe import PostgresObserve
from ._schedules import PostgresSchedules
from ._workflows import PostgresWorkflows

__all__ = ["PostgresBackend"]

log = logging.getLogger("eventbus.postgres")

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


# Backfills owed at registration are finished inline when the transactions
# that overlapped it end this soon; housekeeping finishes the others.
_INLINE_BACKFILL_SECONDS = 2.0


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
        if ":" in port and not port.rpartition(":")[2].isdigit():
            raise ConfigurationError(f"invalid PostgreSQL DSN: port of {host!r} is not a number")
    return dsn


# How long a pooled connection keeps a prepared statement before preparing it
# again. PostgreSQL settles on a generic plan after five executions and keeps
# it until the table's statistics change; where autovacuum is off or behind, a
# plan made while the tables were nearly empty (a sequential scan of
# deliveries for the claim's update, a hash join to events) stays in use as
# they grow, and the claim slowed from 12,000/s to 3,500/s within 30 s here.
# Preparing again costs one round trip per statement and connection per period.
STATEMENT_LIFETIME_SECONDS = 30
# The lease sweep from the start (see recover_expired) runs at least this often,
# spaced by its cost; the windowed sweep starts _SWEEP_OVERLAP before where the
# previous one ended.
_FULL_SWEEP_EVERY = 60.0
_SWEEP_OVERLAP = datetime.timedelta(seconds=2)


async def _keep_session(conn: Any) -> None:
    """Pool reset hook: nothing to undo.

    The backend changes no session state on pooled connections (no SET, no
    LISTEN, only transaction-scoped advisory locks), and asyncpg still rolls
    back a transaction left open, which ends those locks too. The default
    reset query costs a round trip on every release: about a third of a
    single publish.
    """


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


def _detail(row: asyncpg.Record, history: Sequence[AttemptRecord] = ()) -> DeliveryDetail:
    return DeliveryDetail(
        id=DeliveryId(row["id"]),
        event_id=EventId(row["event_id"]),
        subscription=row["subscription"],
        event_type=row["event_type"],
        status=row["status"],
        attempts=row["attempts"],
        key=row["key"],
        payload=bytes(row["payload"]),
        headers=decode_headers(row["headers"]),
        correlation_id=row["correlation_id"],
        causation_id=row["causation_id"],
        last_error=row["last_error"],
        replays=row["replays"],
        run_at=row["run_at"],
        updated_at=row["updated_at"],
        created_at=row["created_at"],
        history=history,
    )


class PostgresBackend(PostgresObserve, PostgresInspection, PostgresSchedules, PostgresWorkflows):
    """Stores the bus in one PostgreSQL schema."""

    kind: Literal["postgres"] = "postgres"

    def __init__(
        self,
        dsn: str,
        schema: str = "eventbus",
        *,
        min_pool_size: int = 1,
        max_pool_size: int = 10,
        command_timeout: float = 60.0,
        statement_lifetime_seconds: int = STATEMENT_LIFETIME_SECONDS,
        migrate: bool = False,
    ) -> None:
        self.dsn = check_dsn(dsn)
        self.auto_migrate = migrate
        self._ready = False
        self.schema = validate_schema(schema)
        self.notify_channel = notify_channel(self.schema)
        self.q = load_queries("postgres", self.schema)
        self._pool_size = (min_pool_size, max_pool_size)
        self._command_timeout = command_timeout
        self._statement_lifetime = statement_lifetime_seconds
        self._pool: asyncpg.Pool | None = None
        self._serial_conn: Any = None  # see publish_serial
        self._serial_lock = asyncio.Lock()
        self._swept_to: datetime.datetime | None = None  # see recover_expired
        self._full_sweep = Spaced(_FULL_SWEEP_EVERY)
        self.listener = PostgresListener(dsn, self.notify_channel)

    # -- lifecycle -------------------------------------------------------

    async def open(self) -> None:
        """Connect; refuse a schema that is missing or behind, unless ``migrate`` was asked for."""
        if self._ready:
            return
        if self.auto_migrate:
            await self.migrate()
            return
        async with self._pool_conn("opening") as conn:
            try:
                rows = await conn.fetch(self.q["migrations_applied"])
            except (asyncpg.exceptions.UndefinedTableError, asyncpg.exceptions.InvalidSchemaNameError):
                raise migrations.not_migrated(f"PostgreSQL schema {self.schema!r}", []) from None
        todo = migrations.pending(
            migrations.discover("postgres"), {r["version"]: r["checksum"] for r in rows}
        )
        if todo:
            raise migrations.not_migrated(f"PostgreSQL schema {self.schema!r}", todo)
        self._ready = True

    async def _ensure_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            with translate_errors("connecting", self._command_timeout):
                try:
                    self._pool = await asyncpg.create_pool(
                        self.dsn,
                        min_size=self._pool_size[0],
                        max_size=self._pool_size[1],
                        command_timeout=self._command_timeout,
                        max_cached_statement_lifetime=self._statement_lifetime,
                        reset=_keep_session,
                    )
                except ValueError as exc:  # the DSN (asyncpg parses it here)
                    raise ConfigurationError(f"invalid PostgreSQL DSN: {exc}") from exc
        return self._pool

    @contextlib.asynccontextmanager
    async def _pool_conn(self, operation: str = "a query") -> AsyncIterator[Any]:
        """A pooled connection, without the schema check of :meth:`open`."""
        pool = await self._ensure_pool()
        with translate_errors(operation, self._command_timeout):
            async with pool.acquire() as conn:
                yield conn

    async def aclose(self) -> None:
        with anyio.move_on_after(10):  # a publish in flight on the held connection finishes first
            async with self._serial_lock:
                await self._release_serial()
        await self._release_serial()
        pool, self._pool = self._pool, None
        self._ready = False
        if pool is not None:
            try:
                with anyio.move_on_after(10):
                    await pool.close()
            finally:
                pool.terminate()  # also when the caller gave up waiting for the graceful close

    @contextlib.asynccontextmanager
    async def _conn(self, operation: str = "a query") -> AsyncIterator[Any]:
        await self.open()
        async with self._pool_conn(operation) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _tx(self, operation: str = "a transaction") -> AsyncIterator[Any]:
        async with self._conn(operation) as conn, conn.transaction():
            yield conn

    async def migrate(self) -> list[str]:
        """Apply pending migrations, one transaction per file; return the names applied."""
        applied_now: list[str] = []
        async with self._pool_conn("migrate") as conn:
            while (name := await self._migrate_next(conn)) is not None:
                applied_now.append(name)
        self._ready = True
        return applied_now

    async def _migrate_next(self, conn: Any) -> str | None:
        """Apply the first pending file under the migration lock; None when none is left.

        The lock is transaction-scoped: it ends with the transaction however the
        call ends, so a cancelled migrate cannot leave it on a pooled connection.
        """
        async with conn.transaction():
            await conn.execute(self.q["migration_lock"], self.notify_channel)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_schema(self.schema)}")
            await conn.execute(self.q["migrations_table"])
            rows = await conn.fetch(self.q["migrations_applied"])
            todo = migrations.pending(
                migrations.discover("postgres"), {r["version"]: r["checksum"] for r in rows}
            )
            if not todo:
                return None
            await conn.execute(todo[0].sql.replace("{schema}", quote_schema(self.schema)))
            await conn.execute(self.q["migration_record"], todo[0].version, todo[0].name, todo[0].checksum)
        return todo[0].name

    async def analyze(self) -> None:
        async with self._pool_conn("analyze") as conn:
            await conn.execute(self.q["analyze"])

    async def drop(self) -> None:
        async with self._pool_conn("drop") as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_schema(self.schema)} CASCADE")
        await self.aclose()

    # -- publish ---------------------------------------------------------

    async def publish(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        if not events:
            return []
        if len(events) == 1 and not self._serial_lock.locked():  # one event: the held connection is free
            return await self.publish_serial(events)
        return await self._publish_pooled(events)

    async def _publish_pooled(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        async with self._conn("publish") as conn:
            return await self._publish_on(conn, events)

    async def publish_serial(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Publish on a connection held for the coalescer, which sends one batch at a time.

        A pool acquire and release cost about as much client time as the
        statement itself (asyncpg wraps each in a proxy, a future and a
        shielded task): a third of a lone publish here. The connection stays a
        member of the pool. One that fails for any reason but the database's
        refusal of the statement goes back to the pool (which closes or resets
        it) and the next call takes another. A pool of one connection keeps none
        aside: everything else would wait for it.
        """
        if not events:
            return []
        if self._pool_size[1] < 2:
            return await self._publish_pooled(events)
        async with self._serial_lock:
            conn = self._serial_conn
            if conn is None:
                await self.open()
                pool = await self._ensure_pool()
                with translate_errors("publish", self._command_timeout):
                    conn = self._serial_conn = await pool.acquire()
            try:
                with translate_errors("publish", self._command_timeout):
                    return await self._publish_on(conn, events)
            except BackendUnavailable:
                await self._release_serial()
                raise
            except EventBusError:  # the database refused the statement: the connection is sound
                raise
            except BaseException:  # cancelled mid-statement: the pool waits out the cancellation
                await self._release_serial()
                raise

    async def _release_serial(self) -> None:
        conn, self._serial_conn = self._serial_conn, None
        pool = self._pool
        if conn is not None and pool is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await pool.release(conn)

    async def publish_in(self, connection: Any, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Publish on the caller's asyncpg connection: the events exist only if its transaction commits."""
        if not events:
            return []
        with translate_errors("publish", self._command_timeout):
            return await self._publish_on(connection, events)

    async def _publish_on(
        self, conn: asyncpg.Connection, events: Sequence[OutgoingEvent]
    ) -> list[PublishResult]:
        inserted = await self._insert(conn, events)
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

    async def _insert(self, conn: asyncpg.Connection, events: Sequence[OutgoingEvent]) -> dict[int, int]:
        """Insert and fan out; map input index -> new event id (a taken key has none)."""
        if len(events) > 1:
            rows = await conn.fetch(self.q["publish"], *_columns(events), self.notify_channel)
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
            self.notify_channel,
        )
        return {} if new_id is None else {0: new_id}

    # -- subscriptions ---------------------------------------------------

    async def register(self, specs: Sequence[SubscriptionSpec], *, served: bool = False) -> dict[str, int]:
        ids: dict[str, int] = {}
        owed: list[int] = []
        async with self._tx("register") as conn:
            for spec in specs:
                row = await conn.fetchrow(
                    self.q["register"],
                    spec.name,
                    spec.event_type,
                    spec.max_attempts,
                    spec.lease_seconds,
                    spec.ordered,
                    served,
                )
                if row is None:
                    raise RegistrationError(
                        f"subscription {spec.name!r} is already bound to another event type; "
                        "pick a new name for a new event type"
                    )
                ids[spec.name] = row["id"]
                if served and row["state"] != "active":
                    warn_not_active(spec.name, row["state"])
                if not row["created"] and row["was_ordered"] != spec.ordered:
                    await conn.execute(self.q["rekey"], row["id"], spec.ordered)
                if row["created"] and spec.start_from == "earliest":
                    await conn.execute(self.q["backfill"], row["id"])
                    await conn.execute(self.q["backfill_owed"], row["id"])
                    owed.append(row["id"])
        if owed:
            await self._finish_backfills_soon(owed, _INLINE_BACKFILL_SECONDS)
        else:
            await self.finish_backfills()  # what an earlier registration left owed
        return ids

    async def _finish_backfills_soon(self, owed: list[int], seconds: float) -> None:
        """Finish the backfills ``owed`` if their overlapping transactions end within ``seconds``.

        The backfill in the registering transaction saw every event committed
        before it; what it could not see is left to :meth:`finish_backfills`.
        """
        with anyio.move_on_after(seconds):
            while True:
                await self.finish_backfills()
                async with self._conn("finishing backfills") as conn:
                    if not await conn.fetchval(self.q["backfills_exist"], owed):
                        return
                await anyio.sleep(0.02)

    async def finish_backfills(self) -> int:
        async with self._conn("finishing backfills") as conn:
            if not await conn.fetchval(self.q["backfills_exist"], None):
                return 0
            await conn.execute(self.q["backfill_sessions"])
            finished = 0
            for row in await conn.fetch(self.q["backfills_settled"]):
                async with conn.transaction():
                    if await conn.fetchval(self.q["backfill_settle"], row["subscription_id"]) is not None:
                        await conn.execute(self.q["backfill"], row["subscription_id"])
                        finished += 1
        return finished

    # -- the delivery state machine -------------------------------------

    async def claim(
        self,
        subscription_id: int,
        limit: int,
        lease_seconds: float,
        worker_id: str,
        ordered: bool = False,
        after: Any = None,
    ) -> list[ClaimedDelivery]:
        token = uuid.uuid4()
        args: tuple[Any, ...] = (subscription_id, limit, lease_seconds, token, uuid.UUID(worker_id))
        if ordered:
            query = self.q["claim_ordered"]
        elif after is not None:
            query, args = self.q["claim_after"], (*args, *after)
        else:
            query = self.q["claim"]
        async with self._conn("claim") as conn:
            try:
                rows = await conn.fetch(query, *args)
            except asyncpg.exceptions.UniqueViolationError:
                if not ordered:
                    raise
                # A replay revived a key's head while another worker claimed a
                # later row of the key: the index refused one of the two.
                return []
        text_token = str(token)
        return [
            ClaimedDelivery(
                id=r["id"],
                event_id=r["event_id"],
                subscription_id=subscription_id,
                attempts=r["attempts"],
                lease_token=text_token,
                event_type=r["event_type"],
                payload=r["payload"],
                headers=decode_headers(r["headers"]),
                key=r["key"],
                correlation_id=r["correlation_id"],
                ordering_key=r["ordering_key"],
                created_at=r["created_at"],
                position=(r["run_at"], r["id"]),
                run_at=r["run_at"],
                causation_id=r["causation_id"],
            )
            for r in rows
        ]

    async def complete(self, completions: Sequence[Completion]) -> set[LeaseKey]:
        """Mark completed and insert follow-ups, in one transaction, for owned rows only.

        Follow-ups are kept by (delivery, token): a stale run of a delivery
        whose fresh run completes in the same batch adds none.
        """
        if not completions:
            return set()
        by_token: dict[str, list[DeliveryId]] = {}
        for c in completions:
            by_token.setdefault(c.lease_token, []).append(c.delivery_id)
        done: set[LeaseKey] = set()
        async with self._tx("complete") as conn:
            for token, ids in by_token.items():
                rows = await conn.fetch(self.q["complete"], ids, token)
                done.update((DeliveryId(r["id"]), token) for r in rows)
            follow_ups = [e for c in completions if c.follow_ups and c.lease in done for e in c.follow_ups]
            if follow_ups:
                await self._publish_on(conn, follow_ups)
        return done

    async def fail(self, failures: Sequence[Failure]) -> set[LeaseKey]:
        if not failures:
            return set()
        f = failures
        async with self._conn("fail") as conn:
            rows = await conn.fetch(
                self.q["fail"],
                [x.delivery_id for x in f],
                [x.lease_token for x in f],
                [x.dead for x in f],
                [x.retry_delay_seconds for x in f],
                [x.error_type for x in f],
                [x.message for x in f],
                [x.traceback for x in f],
                [x.duration_seconds for x in f],
                [x.worker_id for x in f],
                self.notify_channel,
            )
        return {(DeliveryId(r["id"]), r["token"]) for r in rows}

    async def release(self, ids: Sequence[DeliveryId], lease_token: str) -> int:
        if not ids:
            return 0
        async with self._conn("release") as conn:
            row = await conn.fetchrow(self.q["release"], list(ids), lease_token, self.notify_channel)
        return int(row["released"])

    async def extend(
        self, ids: Sequence[DeliveryId], lease_token: str, lease_seconds: float
    ) -> set[DeliveryId]:
        async with self._conn("lease renewal") as conn:
            rows = await conn.fetch(self.q["extend"], list(ids), lease_token, lease_seconds)
        return {DeliveryId(r["id"]) for r in rows}

    async def recover_expired(self, limit: int = 1000) -> int:
        """Sweep from where the last sweep left off, and from the start now and then.

        Every finished delivery leaves an entry in ``deliveries_lease_until``
        that only vacuum removes; while a long transaction holds back the
        xmin horizon none is removed, and a sweep from the start would walk
        them all every second. A lease that expired before the window (a
        locked row whose holder then rolled back) is found by the sweep from
        the start, made first and then spaced by its cost.
        """
        started = time.monotonic()
        floor = self._swept_to if started < self._full_sweep.due_at else None
        async with self._conn("lease recovery") as conn:
            row = await conn.fetchrow(self.q["recover_expired"], limit, self.notify_channel, floor)
        ended = time.monotonic()
        if floor is None:
            self._full_sweep.ran(started, ended)
        if row["expired"] < limit:  # else more are left past this sweep's end: start there again
            self._swept_to = row["swept_at"] - _SWEEP_OVERLAP
        return int(row["recovered"])

    async def next_run_in(self, subscription_id: int, after: Any = None) -> float | None:
        since = None if after is None else after[0]
        async with self._conn("next_run_in") as conn:
            value = await conn.fetchval(self.q["next_run_in"], subscription_id, since)
        return None if value is None else float(value)

    # -- wake-ups --------------------------------------------------------

    async def run_listener(self) -> None:
        await self.listener.run()

    async def wait_for_events(self, timeout: float) -> set[str]:
        return await self.listener.wait(timeout)

    def wake_local(self, event_types: set[str]) -> None:
        """Wake this process's worker without a round trip to the database."""
        self.listener.push(event_types)

    async def worker_beat(
        self, worker_id: str, *, gone: bool = False, subscription_ids: Sequence[int] = ()
    ) -> None:
        async with self._conn("worker heartbeat") as conn:
            if gone:
                await conn.execute(self.q["worker_gone"], uuid.UUID(worker_id))
                return
            await conn.execute(
                self.q["worker_beat"],
                uuid.UUID(worker_id),
                socket.gethostname(),
                os.getpid(),
                self.listener.healthy,
                self.listener.reconnects,
            )
            if subscription_ids:
                await conn.execute(self.q["subscriptions_seen"], list(subscription_ids))

    # -- operations ------------------------------------------------------

    async def status(self) -> StatusReport:
        async with self._conn("status") as conn:
            rows = await conn.fetch(self.q["status"])
            oldest = await conn.fetchval(self.q["status_oldest_pending"])
            events = await conn.fetchval(self.q["status_events"])
            workers = await conn.fetch(self.q["status_workers"])
            subscriptions = await conn.fetch(self.q["subscriptions"])
        return StatusReport(
            rows=[StatusRow(**dict(r)) for r in rows],
            oldest_pending_seconds=oldest,
            events=events,
            workers=[WorkerRow(**dict(w)) for w in workers],
            subscriptions=[SubscriptionInfo(**dict(r)) for r in subscriptions],
        )

    async def list_subscriptions(self) -> list[SubscriptionInfo]:
        async with self._conn("list subscriptions") as conn:
            rows = await conn.fetch(self.q["subscriptions"])
        return [SubscriptionInfo(**dict(r)) for r in rows]

    async def show(self, delivery_id: int) -> DeliveryDetail:
        async with self._conn("show") as conn:
            row = await conn.fetchrow(self.q["detail"], delivery_id)
            if row is None:
                raise NotFound(f"no delivery {delivery_id}")
            history = await conn.fetch(self.q["history"], delivery_id)
        return _detail(row, [AttemptRecord(**dict(h)) for h in history])

    async def list_dead(
        self, flt: DeadLetterFilter, limit: int = 100, after_id: int = 0
    ) -> list[DeliveryDetail]:
        ids = list(flt.ids) if flt.ids is not None else None
        async with self._conn("list_dead") as conn:
            rows = await conn.fetch(
                self.q["list_dead"],
                ids,
                flt.subscription,
                flt.event_type,
                flt.since,
                after_id,
                limit,
            )
        return [_detail(r) for r in rows]

    async def dead_ids(self, flt: DeadLetterFilter, limit: int, after_id: int = 0) -> list[DeliveryId]:
        ids = list(flt.ids) if flt.ids is not None else None
        async with self._conn("dead_ids") as conn:
            rows = await conn.fetch(
                self.q["dead_ids"], ids, flt.subscription, flt.event_type, flt.since, after_id, limit
            )
        return [DeliveryId(r["id"]) for r in rows]

    async def replay_ids(self, ids: Sequence[int]) -> int:
        async with self._tx("replay") as conn:
            rows = await conn.fetch(self.q["replay"], list(ids))
            subs = sorted({r["subscription_id"] for r in rows})
            if subs:
                await conn.execute(self.q["notify_subscriptions"], self.notify_channel, subs)
        return len(rows)

    async def purge_ids(self, ids: Sequence[int]) -> int:
        async with self._conn("purge") as conn:
            return int(await conn.fetchval(self.q["purge"], list(ids)))

    async def cancel_ids(self, ids: Sequence[int]) -> int:
        async with self._conn("cancel") as conn:
            rows = await conn.fetch(self.q["cancel"], list(ids))
        return len(rows)

    async def pause_subscription(self, name: str) -> bool:
        async with self._tx("pause subscription") as conn:
            return await self._move_subscription(conn, name, "paused", ["active"]) is not None

    async def resume_subscription(self, name: str) -> bool:
        async with self._tx("resume subscription") as conn:
            row = await self._move_subscription(conn, name, "active", ["paused", "removed"])
            if row is not None:
                await conn.execute(self.q["notify_subscriptions"], self.notify_channel, [row["id"]])
        return row is not None

    async def remove_subscription(self, name: str) -> int:
        async with self._tx("remove subscription") as conn:
            # Again on a removed one: a delivery that was running then may have come back to pending.
            row = await self._move_subscription(conn, name, "removed", ["active", "paused", "removed"])
            if row is None:
                return 0
            result = await conn.execute(self.q["cancel_subscription"], row["id"])
        return int(result.split()[-1])

    async def _move_subscription(
        self, conn: Any, name: str, state: str, from_states: list[str]
    ) -> asyncpg.Record | None:
        """One guarded state change; :class:`NotFound` when no subscription has the name."""
        row = await conn.fetchrow(self.q["subscription_state"], name, state, from_states)
        if row is None and await conn.fetchval(self.q["subscription_exists"], name) is None:
            raise NotFound(f"no subscription named {name!r}")
        return row  # type: ignore[no-any-return]


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
