"""SQLite backend: one embedded file, short BEGIN IMMEDIATE transactions, polled wake-ups.

Each backend holds two connections to the file, each driven from a worker
thread one call at a time: the *writer* runs every write transaction as one
synchronous function (see :mod:`._sqlite_sync`), so no handler or other
coroutine ever runs while the write lock is held; the *reader* serves status
and dead-letter queries, polls ``PRAGMA data_version`` for commits by other
processes, and checkpoints the WAL (TRUNCATE: every 1,000 commits, at each
worker heartbeat, and as soon as a commit finds the WAL past 16 MiB, which keeps
it near that size under sustained writes even when some reader is always in the
file). Several processes may share one file:
SQLite serialises their writers, and a busy file is retried, never reported.

Differences from PostgreSQL: no ``connection=`` publishing (there is no
caller's transaction to join), claims serialise on the file's write lock
instead of skipping locked rows, and other processes' commits are noticed by
polling (every ``poll_interval_seconds``) instead of LISTEN/NOTIFY.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import anyio

from ...errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    NotFound,
)
from ...types import (
    DeadLetterFilter,
    DeliveryDetail,
    DeliveryId,
    PublishResult,
    StatusReport,
    StatusRow,
    SubscriptionInfo,
    WorkerRow,
)
from .. import _migrations as migrations
from .._sql import load_queries
from .._wakeup import SWEEP, Waker
from ..base import ClaimedDelivery, Completion, Failure, LeaseKey, OutgoingEvent, SubscriptionSpec
from . import _link as sqlconn
from . import _units as sync
from ._inspect import SQLiteInspection
from ._observe import SQLiteObserve
from ._schedules import SQLiteSchedules
from ._workflows import SQLiteWorkflows

__all__ = ["SQLiteBackend"]

log = logging.getLogger("eventbus.sqlite")

T = TypeVar("T")

_MIN_VERSION = (3, 35, 0)  # UPDATE … RETURNING
_READER_BUSY_TIMEOUT_MS = 250  # short, so a checkpoint never stalls the poller
_CHECKPOINT_EVERY_WRITES = 1000
# Truncate the WAL once a commit finds it past this size. The automatic
# PASSIVE checkpoints copy pages but cannot rewind a WAL that some reader is
# always in, so under sustained writes it would grow without bound.
_CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024


def _agree(name: str, argument: T | None, from_dsn: T | None, default: T) -> T:
    """One option from the keyword argument or the DSN; both must agree when both are given."""
    if argument is not None and from_dsn is not None and argument != from_dsn:
        raise ConfigurationError(
            f"{name} is {from_dsn!r} in the DSN but {argument!r} as an argument: give it once"
        )
    if argument is not None:
        return argument
    return from_dsn if from_dsn is not None else default


class SQLiteBackend(SQLiteObserve, SQLiteInspection, SQLiteSchedules, SQLiteWorkflows):
    """Stores the bus in one SQLite file, shared by any number of local processes.

    :param dsn: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``,
        optionally with ``?synchronous=NORMAL&busy_timeout_ms=5000`` (the same
        options as the keyword arguments, for CLIs and ``$EVENTBUS_DSN``).
    :param synchronous: ``"FULL"`` (default: a commit survives power loss) or
        ``"NORMAL"`` (faster; in WAL mode the last commits may be lost on power
        loss, never on a process crash, and the file is never corrupted).
    :param busy_timeout_ms: patience for another process's write lock (default
        30000): a call keeps waiting, in slices of at most 100 ms so that a
        cancelled call never waits on, for four times this (at least 5 s)
        before it raises :class:`~eventbus.BackendUnavailable`.
    :param poll_interval_seconds: how often the worker's poller checks for
        commits by other processes.

    An option given both in the DSN and as a keyword argument must agree.
    """

    kind: Literal["sqlite"] = "sqlite"

    def __init__(
        self,
        dsn: str,
        *,
        synchronous: str | None = None,
        busy_timeout_ms: int | None = None,
        poll_interval_seconds: float = 0.05,
        migrate: bool = False,
    ) -> None:
        parsed = sqlconn.parse_dsn(dsn)
        synchronous = _agree("synchronous", synchronous and synchronous.upper(), parsed.synchronous, "FULL")
        busy_timeout_ms = _agree("busy_timeout_ms", busy_timeout_ms, parsed.busy_timeout_ms, 30000)
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigurationError("synchronous must be 'FULL', 'NORMAL' or 'EXTRA'")
        if busy_timeout_ms < 0:
            raise ConfigurationError("busy_timeout_ms cannot be negative")
        self.dsn = dsn
        self.auto_migrate = migrate
        self.path = parsed.path
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self.poll_interval_seconds = poll_interval_seconds
        # Give up on a locked file only after several busy timeouts.
        self.lock_deadline_seconds = max(5.0, 4 * busy_timeout_ms / 1000)
        self.q = load_queries("sqlite", "main")
        self.listener_ok = False
        self.listener_reconnects = 0
        self._writer: sqlconn.Link | None = None
        self._reader: sqlconn.Link | None = None
        self._migrated = False
        self._writes = 0
        self._wal_path = f"{self.path}-wal"
        self._wal_bytes = 0  # size of the WAL after this process's last commit
        self._open_lock = anyio.Lock()
        self._waker = Waker()

    # -- lifecycle -------------------------------------------------------

    async def open(self) -> None:
        """Connect; refuse a file that is missing or not migrated, unless ``migrate`` was asked for.

        A missing file is never created here, so a read-only command on a
        mistyped path says so instead of leaving an empty database behind.
        """
        if self._migrated:
            return
        async with self._open_lock:
            if self._migrated:
                return
            if not self.auto_migrate and not await anyio.Path(self.path).exists():
                raise migrations.not_migrated(f"no eventbus database at {self.path}", [])
            writer = await self._connect()
            read_applied = functools.partial(sync.applied_migrations, q=self.q)
            deadline = writer.deadline_seconds
            applied = await writer.run(lambda c: sqlconn.read(c, read_applied, deadline))
            todo = migrations.pending(migrations.discover("sqlite"), applied or {})
            if todo and not self.auto_migrate:
                raise migrations.not_migrated(f"SQLite database {self.path}", [] if applied is None else todo)
            if todo:
                await self._apply_migrations(writer)
            self._migrated = True

    async def migrate(self) -> list[str]:
        """Apply pending migrations, one BEGIN IMMEDIATE transaction per file."""
        async with self._open_lock:
            names = await self._apply_migrations(await self._connect())
            self._migrated = True
        return names

    async def analyze(self) -> None:
        await self._write(lambda c, _q, _now: c.execute("ANALYZE"))

    async def drop(self) -> None:
        await self.aclose()
        for suffix in ("", "-wal", "-shm"):
            await anyio.Path(self.path + suffix).unlink(missing_ok=True)

    async def _apply_migrations(self, writer: sqlconn.Link) -> list[str]:
        names: list[str] = []
        while (name := await self._write_on(writer, sync.apply_next_migration)) is not None:
            names.append(name)
        return names

    async def _connect(self) -> sqlconn.Link:
        """The writer link, connecting both links first if needed (under _open_lock)."""
        if self._writer is not None:
            return self._writer
        if sqlite3.sqlite_version_info < _MIN_VERSION:
            raise ConfigurationError(
                f"SQLite {sqlite3.sqlite_version} is too old: eventbus needs 3.35 or newer"
            )
        writer = await self._new_link(self.busy_timeout_ms)
        try:
            await writer.run(sqlconn.enable_wal)
            self._reader = await self._new_link(_READER_BUSY_TIMEOUT_MS)
        except BaseException:
            await writer.close()
            raise
        self._writer = writer
        return writer

    async def _new_link(self, busy_timeout_ms: int) -> sqlconn.Link:
        return await sqlconn.Link.open(
            self.path, self.synchronous, busy_timeout_ms, self.lock_deadline_seconds
        )

    async def aclose(self) -> None:
        writer, reader = self._writer, self._reader
        self._writer = self._reader = None
        self._migrated = False
        for link in (reader, writer):
            if link is not None:
                await link.close()

    async def _link(self, *, reader: bool = False) -> sqlconn.Link:
        await self.open()
        link = self._reader if reader else self._writer
        if link is None:
            raise BackendUnavailable("the SQLite backend was closed")
        return link

    # -- running units of work ----------------------------------------------

    async def _write(self, body: Callable[..., T], *args: Any) -> T:
        """Run ``body(conn, q, now, *args)`` as one write transaction."""
        return await self._write_on(await self._link(), body, *args)

    async def _write_on(self, link: sqlconn.Link, body: Callable[..., T], *args: Any) -> T:
        result = await link.run(self._transaction(link, body, args))
        await self._wrote()
        return result

    async def _write_if(
        self, probe: str, params: dict[str, Any], body: Callable[..., T], *args: Any
    ) -> T | None:
        """As :meth:`_write`, only when the autocommit ``probe`` finds a row.

        Spares the file's write lock, which every process contends for, when
        there is nothing to do.
        """
        link = await self._link()
        sql, deadline = self.q[probe], link.deadline_seconds
        transaction = self._transaction(link, body, args)

        def unit(conn: sqlite3.Connection) -> T | None:
            if not sqlconn.read(conn, lambda c: sync.has_rows(c, sql, params), deadline):
                return None
            return transaction(conn)

        result = await link.run(unit)
        if result is not None:
            await self._wrote()
        return result

    def _transaction(
        self, link: sqlconn.Link, body: Callable[..., T], args: tuple[Any, ...]
    ) -> Callable[[sqlite3.Connection], T]:
        q, deadline = self.q, link.deadline_seconds

        def unit(conn: sqlite3.Connection) -> T:
            result = sqlconn.write(conn, q, lambda c, now: body(c, q, now, *args), deadline)
            self._wal_bytes = sqlconn.file_size(self._wal_path)  # still on the link's thread
            return result

        return unit

    async def _wrote(self) -> None:
        """Count commits; truncate the WAL every so often and whenever it grew past its bound."""
        self._writes += 1
        if self._wal_bytes > _CHECKPOINT_WAL_BYTES or self._writes % _CHECKPOINT_EVERY_WRITES == 0:
            self._wal_bytes = 0
            await self._checkpoint()

    async def _checkpoint(self) -> None:
        if not await self._read(sqlconn.checkpoint):
            log.debug("WAL checkpoint of %s deferred: a reader or writer was in the way", self.path)

    async def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        link = await self._link(reader=True)
        deadline = link.deadline_seconds
        return await link.run(lambda conn: sqlconn.read(conn, body, deadline))

    async def _fetch(self, name: str, params: Any = ()) -> list[sqlite3.Row]:
        sql = self.q[name]
        return await self._read(lambda c: c.execute(sql, params).fetchall())

    # -- publish ---------------------------------------------------------

    async def publish(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        if not events:
            return []
        results, types = await self._write(sync.publish, events)
        if types:
            self.wake_local(types)
        return results

    async def publish_serial(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Every write already goes through the one connection's thread."""
        return await self.publish(events)

    # -- subscriptions ---------------------------------------------------

    async def register(self, specs: Sequence[SubscriptionSpec], *, served: bool = False) -> dict[str, int]:
        return await self._write(sync.register, specs, served)

    async def finish_backfills(self) -> int:
        """Nothing is ever owed: the backfill under the write lock in :meth:`register` is complete."""
        return 0

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
        # ``after`` is a hint for PostgreSQL's MVCC (dead index entries); SQLite
        # updates rows in place, so a claim from the start costs the same.
        del after
        token = str(uuid.uuid4())
        params = {
            "subscription_id": subscription_id,
            "limit": limit,
            "lease_seconds": lease_seconds,
            "lease_token": token,
            "worker_id": worker_id,
        }
        probe = {"subscription_id": subscription_id}
        pairs = await self._write_if("claim_probe", probe, sync.claim, params, ordered)
        return [sync.claimed_of(p, subscription_id, token) for p in pairs or ()]

    async def complete(self, completions: Sequence[Completion]) -> set[LeaseKey]:
        """Mark completed and insert follow-ups, in one transaction, for owned rows only."""
        if not completions:
            return set()
        done, _results, types = await self._write(sync.complete, completions)
        if types:
            self.wake_local(types)
        return done

    async def fail(self, failures: Sequence[Failure]) -> set[LeaseKey]:
        if not failures:
            return set()
        return await self._write(sync.fail, failures)

    async def release(self, ids: Sequence[DeliveryId], lease_token: str) -> int:
        if not ids:
            return 0
        moved, types = await self._write(sync.release, ids, lease_token)
        if types:
            self.wake_local(types)  # other processes see the commit (data_version)
        return moved

    async def extend(
        self, ids: Sequence[DeliveryId], lease_token: str, lease_seconds: float
    ) -> set[DeliveryId]:
        if not ids:
            return set()
        return await self._write(sync.extend, ids, lease_token, lease_seconds)

    async def recover_expired(self, limit: int = 1000) -> int:
        recovered = await self._write_if("recover_probe", {}, sync.recover_expired, limit)
        if recovered is None:
            return 0
        moved, types = recovered
        if types:
            self.wake_local(types)  # other processes see the commit (data_version)
        return moved

    async def next_run_in(self, subscription_id: int, after: Any = None) -> float | None:
        rows = await self._fetch("next_run_in", {"subscription_id": subscription_id})
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    # -- wake-ups --------------------------------------------------------

    async def run_listener(self) -> None:
        """Poll ``PRAGMA data_version``; sweep when another connection committed."""
        last, failures = None, 0
        while True:
            try:
                version = (await self._fetch("data_version"))[0][0]
            except BackendError as exc:
                log.warning("polling %s for commits failed: %s", self.path, exc)
                self.listener_ok, failures = False, failures + 1
                self.listener_reconnects += 1
                await anyio.sleep(min(5.0, 0.1 * 2**failures))
                continue
            self.listener_ok, failures = True, 0
            if version != last:
                self.wake_local({SWEEP})  # the first poll sweeps whatever was missed
                last = version
            await anyio.sleep(self.poll_interval_seconds)

    async def wait_for_events(self, timeout: float) -> set[str]:
        return await self._waker.wait(timeout)

    def wake_local(self, event_types: set[str]) -> None:
        """Wake this process's worker without touching the database."""
        self._waker.push(event_types)

    async def worker_beat(
        self, worker_id: str, *, gone: bool = False, subscription_ids: Sequence[int] = ()
    ) -> None:
        """Record the worker's heartbeat, then keep the WAL bounded."""
        params = (
            None
            if gone
            else {
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "listener_ok": int(self.listener_ok),
                "listener_reconnects": self.listener_reconnects,
            }
        )
        await self._write(sync.worker_beat, params, worker_id, list(subscription_ids))
        if not gone:
            await self._checkpoint()

    # -- operations ------------------------------------------------------

    async def status(self) -> StatusReport:
        q = self.q

        def body(c: sqlite3.Connection) -> StatusReport:
            workers = []
            for row in c.execute(q["status_workers"]).fetchall():
                w = dict(row)
                w["started_at"] = sync.to_time(w["started_at"])
                w["heartbeat_at"] = sync.to_time(w["heartbeat_at"])
                w["listener_ok"] = bool(w["listener_ok"])
                workers.append(WorkerRow(**w))
            return StatusReport(
                rows=[StatusRow(**dict(r)) for r in c.execute(q["status"]).fetchall()],
                oldest_pending_seconds=c.execute(q["status_oldest_pending"]).fetchone()[0],
                events=c.execute(q["status_events"]).fetchone()[0],
                workers=workers,
                subscriptions=[sync.subscription_of(r) for r in c.execute(q["subscriptions"])],
            )

        return await self._read(body)

    async def show(self, delivery_id: int) -> DeliveryDetail:
        rows = await self._fetch("detail", {"id": delivery_id})
        if not rows:
            raise NotFound(f"no delivery {delivery_id}")
        history = await self._fetch("history", {"id": delivery_id})
        return sync.detail_of(rows[0], [sync.attempt_of(h) for h in history])

    async def list_dead(
        self, flt: DeadLetterFilter, limit: int = 100, after_id: int = 0
    ) -> list[DeliveryDetail]:
        params = {**sync.filter_params(flt, sync.to_epoch(flt.since)), "after_id": after_id, "limit": limit}
        return [sync.detail_of(r) for r in await self._fetch("list_dead", params)]

    async def dead_ids(self, flt: DeadLetterFilter, limit: int, after_id: int = 0) -> list[DeliveryId]:
        params = {**sync.filter_params(flt, sync.to_epoch(flt.since)), "after_id": after_id, "limit": limit}
        return [DeliveryId(int(r[0])) for r in await self._fetch("dead_ids", params)]

    async def replay_ids(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        moved, types = await self._write(sync.replay, ids)
        if types:
            self.wake_local(types)
        return moved

    async def purge_ids(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        return await self._write(sync.purge, ids)

    async def cancel_ids(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        return await self._write(sync.cancel, ids)

    async def list_subscriptions(self) -> list[SubscriptionInfo]:
        return [sync.subscription_of(r) for r in await self._fetch("subscriptions")]

    async def pause_subscription(self, name: str) -> bool:
        return await self._write(sync.move_subscription, name, "paused", ("active",)) is not None

    async def resume_subscription(self, name: str) -> bool:
        moved = await self._write(sync.move_subscription, name, "active", ("paused", "removed"))
        if moved is not None:
            self.wake_local({moved[1]})
        return moved is not None

    async def remove_subscription(self, name: str) -> int:
        return await self._write(sync.remove_subscription, name)
