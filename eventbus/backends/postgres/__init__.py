"""PostgreSQL backend on asyncpg: SKIP LOCKED claims and LISTEN/NOTIFY wake-ups.

:class:`PostgresBackend` builds one session (:class:`~._db.PgDb`: the pool,
the connection held for lone publishes, the named queries of ``queries/``)
and one object per port on it, each in the module named after its port.
The DSN's own options (``pooler``, ``listen_dsn``, ...) are read in ``_dsn``.
"""

from __future__ import annotations

import os
from typing import Literal

from ..._priority import DEFAULT_PRIORITY_STEP_SECONDS, checked_priority_step
from ...errors import ConfigurationError
from ..base import Backend
from ._db import DEAD_CLIENT_SECONDS, STATEMENT_LIFETIME_SECONDS, PgDb
from ._dsn import pg_options
from ._reads import ReadPool
from .delivery import PgDeliveries
from .inspect import PgInspector
from .operate import PgOperator
from .retention import PgRetention
from .rollup import PgRollup
from .schedules import PgSchedules
from .schema import PgSchema
from .wakeups import PgWakeups
from .workflows import PgWorkflows

__all__ = ["PostgresBackend"]


class PostgresBackend:
    """Stores the bus in one PostgreSQL schema; ``migrate`` applies pending migrations on open.

    ``read_dsn`` (``Bus(dsn, read_dsn=…)`` or ``EVENTBUS_READ_DSN``): a replica
    that answers the inspection reads (status, listings, counts, traces, single
    deliveries and events) through a small read-only pool; claims, results,
    operator actions and the id walks before them stay on the primary
    (see :mod:`eventbus.backends.postgres._reads`).

    ``dead_client_seconds`` (``Bus(dsn, dead_client_seconds=…)``): how soon the
    server ends a session of this bus whose client stopped answering, releasing
    its locks (see :func:`~eventbus.backends.postgres._db.session_settings`);
    ``None`` keeps the server's settings.

    :param pooler: what sits between the bus and PostgreSQL: ``"none"``
        (default), ``"session"`` (a session pooler: nothing changes) or
        ``"transaction"`` (PgBouncer ``pool_mode = transaction`` or a managed
        pooler like it: no named prepared statements, and no LISTEN through
        it). Also the DSN option ``?pooler=transaction``. Behind any pooler the
        ``dead_client_seconds`` settings are not sent (a pooler refuses
        startup parameters): the pooler's own timeouts end a dead client's transaction.
    :param pooler_prepared_statements: the transaction pooler carries
        protocol-level prepared statements (PgBouncer 1.21 or later with
        ``max_prepared_statements`` above zero), so the statement cache stays.
    :param listen_dsn: a direct DSN for the worker's LISTEN connection (also
        ``EVENTBUS_LISTEN_DSN``); behind a transaction pooler without it,
        workers poll every ``poll_interval_seconds``.
    :param poll_interval_seconds: how often a worker that cannot LISTEN looks
        for work (default 0.5).
    :param priority_step_seconds: the seconds of waiting a priority level is
        worth (default 60; see ``Bus``).
    :param append_only: take the append-only hot path (see
        :mod:`eventbus.backends.postgres.ring`): an ordinary delivery is three
        inserts and no update, its space returned by TRUNCATE and DROP. Also
        ``EVENTBUS_APPEND_ONLY=1``.
    """

    kind: Literal["postgres"] = "postgres"

    def __init__(
        self,
        dsn: str,
        schema: str = "eventbus",
        *,
        min_pool_size: int = 1,
        max_pool_size: int | None = None,
        command_timeout: float = 60.0,
        statement_lifetime_seconds: int = STATEMENT_LIFETIME_SECONDS,
        dead_client_seconds: float | None = DEAD_CLIENT_SECONDS,
        read_dsn: str | None = None,
        migrate: bool = False,
        pooler: str | None = None,
        pooler_prepared_statements: bool | None = None,
        listen_dsn: str | None = None,
        poll_interval_seconds: float | None = None,
        priority_step_seconds: float = DEFAULT_PRIORITY_STEP_SECONDS,
        append_only: bool | None = None,
    ) -> None:
        self.options = pg_options(
            dsn,
            pooler=pooler,
            pooler_prepared_statements=pooler_prepared_statements,
            listen_dsn=listen_dsn,
            poll_interval_seconds=poll_interval_seconds,
        )
        """The pooler, LISTEN and poll settings, and the DSN the driver gets."""
        self.db = PgDb(
            self.options.dsn,
            schema,
            min_pool_size=min_pool_size,
            max_pool_size=_pool_size(max_pool_size),
            command_timeout=command_timeout,
            statement_lifetime_seconds=statement_lifetime_seconds,
            statement_cache=self.options.statement_cache,
            transaction_pooler=self.options.pooler == "transaction",
            dead_client_seconds=dead_client_seconds if self.options.pooler == "none" else None,
        )
        self.db.priority_step = checked_priority_step(priority_step_seconds)
        if _append_only(append_only):
            self.db.take_append_only(self.options.pooler)
        self.schema_name = self.db.schema
        """The PostgreSQL schema the bus's tables live in."""
        self.wakeups = PgWakeups(
            self.options.listen_target, self.db.channel, self.options.poll_interval_seconds
        )
        self.deliveries = PgDeliveries(self.db, self.wakeups)
        read_dsn = read_dsn or os.environ.get("EVENTBUS_READ_DSN")
        self.reads = None if not read_dsn else ReadPool(read_dsn, dead_client_seconds, command_timeout)
        """The read-only pool of ``read_dsn`` (a replica), when the bus has one."""
        self.inspect = PgInspector(self.db, self.reads)
        self.operate = PgOperator(self.db)
        self.retention = PgRetention(self.db)
        self.rollup = PgRollup(self.db)
        self.schedules = PgSchedules(self.db)
        self.workflows = PgWorkflows(self.db)
        self.schema = PgSchema(self.db)
        self.db.opener = self.schema.migrate if migrate else self.schema.check

    async def open(self) -> None:
        """Connect; refuse a schema that is missing or behind, unless ``migrate`` was asked for."""
        await self.db.open()

    async def aclose(self) -> None:
        """Let a publish in flight finish, then release every connection; safe to call twice."""
        await self.db.aclose()
        if self.reads is not None:
            await self.reads.aclose()


def _append_only(given: bool | None) -> bool:
    """``append_only`` as given, else ``EVENTBUS_APPEND_ONLY`` (1/true/yes/on or 0/false/no/off)."""
    if given is not None:
        return given
    text = os.environ.get("EVENTBUS_APPEND_ONLY", "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise ConfigurationError(f"EVENTBUS_APPEND_ONLY must be 1 or 0 (or true/false, on/off), got {text!r}")


def _pool_size(given: int | None) -> int:
    """``max_pool_size`` as given, else ``EVENTBUS_MAX_POOL_SIZE``, else 10."""
    if given is not None:
        return given
    text = os.environ.get("EVENTBUS_MAX_POOL_SIZE", "10")
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise ConfigurationError(f"EVENTBUS_MAX_POOL_SIZE must be a whole number of at least 1, got {text!r}")
    return size


_: type[Backend] = PostgresBackend
