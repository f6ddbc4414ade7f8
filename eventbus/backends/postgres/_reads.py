"""Reads that may go to a replica: the pool behind ``read_dsn``.

Status, listings, counts, chains and single deliveries (the inspection port)
can be served by a streaming replica, so dashboards and scripts that poll them
put no load on the primary. Nothing that claims, completes, renews or moves a
delivery ever reads here: those are guarded statements on the primary, and the
id walks that precede an operator's action (replay, purge, cancel by filter)
read the primary too, so a lagging replica cannot make an action miss rows.
Every session of this pool is read-only (``default_transaction_read_only``),
so a write sent here by mistake fails instead of landing on a writable host;
behind a pooler (``read_dsn`` with ``?pooler=…``), which refuses settings at
connection start, none are sent, and the statement cache follows the pooler
as on the primary's pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from ...errors import ConfigurationError
from ._db import STATEMENT_CACHE_SIZE, check_dsn, session_settings, translate_errors
from ._dsn import pg_options

__all__ = ["ReadPool"]

READ_POOL_SIZE = 4
"""Connections the read pool opens at most: reads are short and rare next to claims."""


class ReadPool:
    """A small pool of read-only sessions on ``dsn`` (a replica, or the primary itself)."""

    def __init__(self, dsn: str, dead_client_seconds: float | None, command_timeout: float) -> None:
        options = pg_options(dsn)
        self.dsn = check_dsn(options.dsn)
        self.server_settings = (
            {**session_settings(dead_client_seconds), "default_transaction_read_only": "on"}
            if options.pooler == "none"
            else {}
        )
        self.statement_cache_size = STATEMENT_CACHE_SIZE if options.statement_cache else 0
        self.command_timeout = command_timeout
        self._pool: asyncpg.Pool | None = None

    async def _open(self) -> asyncpg.Pool:
        if self._pool is None:
            with translate_errors("connecting to the read replica", self.command_timeout):
                try:
                    self._pool = await asyncpg.create_pool(
                        self.dsn,
                        min_size=0,
                        max_size=READ_POOL_SIZE,
                        command_timeout=self.command_timeout,
                        server_settings=self.server_settings,
                        statement_cache_size=self.statement_cache_size,
                    )
                except ValueError as exc:
                    raise ConfigurationError(f"invalid PostgreSQL read_dsn: {exc}") from exc
        return self._pool

    @contextlib.asynccontextmanager
    async def conn(self, operation: str) -> AsyncIterator[Any]:
        """A read-only connection; ``operation`` names it in a timeout."""
        pool = await self._open()
        with translate_errors(operation, self.command_timeout):
            async with pool.acquire() as conn:
                yield conn

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
