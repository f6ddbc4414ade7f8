"""PostgreSQL backend on asyncpg: SKIP LOCKED claims and LISTEN/NOTIFY wake-ups.

:class:`PostgresBackend` builds one session (:class:`~._db.PgDb`: the pool,
the connection held for lone publishes, the named queries of ``queries/``)
and one object per port on it, each in the module named after its port.
"""

from __future__ import annotations

from typing import Literal

from ..base import Backend
from ._db import DEAD_CLIENT_SECONDS, STATEMENT_LIFETIME_SECONDS, PgDb
from .delivery import PgDeliveries
from .inspect import PgInspector
from .operate import PgOperator
from .retention import PgRetention
from .schedules import PgSchedules
from .schema import PgSchema
from .wakeups import PgWakeups
from .workflows import PgWorkflows

__all__ = ["PostgresBackend"]


class PostgresBackend:
    """Stores the bus in one PostgreSQL schema; ``migrate`` applies pending migrations on open.

    ``dead_client_seconds`` (``Bus(dsn, dead_client_seconds=…)``): how soon the
    server ends a session of this bus whose client stopped answering, releasing
    its locks (see :func:`~eventbus.backends.postgres._db.session_settings`);
    ``None`` keeps the server's settings.
    """

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
        dead_client_seconds: float | None = DEAD_CLIENT_SECONDS,
        migrate: bool = False,
    ) -> None:
        self.db = PgDb(
            dsn,
            schema,
            min_pool_size=min_pool_size,
            max_pool_size=max_pool_size,
            command_timeout=command_timeout,
            statement_lifetime_seconds=statement_lifetime_seconds,
            dead_client_seconds=dead_client_seconds,
        )
        self.schema_name = self.db.schema
        """The PostgreSQL schema the bus's tables live in."""
        self.wakeups = PgWakeups(self.db)
        self.deliveries = PgDeliveries(self.db, self.wakeups)
        self.inspect = PgInspector(self.db)
        self.operate = PgOperator(self.db)
        self.retention = PgRetention(self.db)
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


_: type[Backend] = PostgresBackend
