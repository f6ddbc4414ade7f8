"""The dedicated LISTEN connection of a worker process.

It reconnects with backoff and jitter when the connection drops, probes itself
with a NOTIFY it must hear back, and after every (re)connect asks the worker
to sweep all subscriptions, because notifications sent while it was away are
lost. The worker's slow poll covers anything else.
"""

from __future__ import annotations

import logging
import random
import uuid
from typing import Any

import anyio
import asyncpg

from .._wakeup import SWEEP, Waker

__all__ = ["PostgresListener"]


log = logging.getLogger("eventbus.listener")


class PostgresListener(Waker):
    """The LISTEN connection; notifications for event types wake the worker."""

    def __init__(
        self,
        dsn: str,
        channel: str,
        *,
        probe_interval_seconds: float = 5.0,
        probe_timeout_seconds: float = 3.0,
        max_backoff_seconds: float = 5.0,
    ) -> None:
        self.dsn = dsn
        self.channel = channel
        self.probe_interval_seconds = probe_interval_seconds
        self.probe_timeout_seconds = probe_timeout_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.probe_payload = f"{SWEEP}probe:{uuid.uuid4()}"
        super().__init__()
        self.healthy = False
        self.reconnects = 0
        self._probe_heard = anyio.Event()
        self._lost = anyio.Event()

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        if not isinstance(payload, str):
            return
        if payload == self.probe_payload:
            self._probe_heard.set()
        elif not payload.startswith(SWEEP + "probe:"):
            self.push({payload})

    def _on_terminate(self, _conn: Any) -> None:
        self._lost.set()

    async def run(self) -> None:
        """Keep one LISTEN connection alive until cancelled."""
        failures = 0
        while True:
            try:
                await self._session()
                failures = 0
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning("LISTEN connection failed: %s", exc)
                failures += 1
            self.healthy = False
            self.reconnects += 1
            delay = random.uniform(0, min(self.max_backoff_seconds, 0.1 * 2**failures))
            await anyio.sleep(delay)

    async def _session(self) -> None:
        conn: asyncpg.Connection = await asyncpg.connect(self.dsn, timeout=10)
        self._lost = anyio.Event()
        try:
            conn.add_termination_listener(self._on_terminate)
            await conn.add_listener(self.channel, self._on_notify)
            self.healthy = True
            self.push({SWEEP})  # listen first, then sweep what was missed
            while await self._healthy_for_a_while(conn):
                pass
        finally:
            self.healthy = False
            # Closed at once: a LISTEN session has nothing to flush, and a
            # graceful close would wait on a server that does not answer.
            conn.terminate()

    async def _healthy_for_a_while(self, conn: asyncpg.Connection) -> bool:
        with anyio.move_on_after(self.probe_interval_seconds):
            await self._lost.wait()
            log.warning("LISTEN connection lost; reconnecting")
            return False
        self._probe_heard = anyio.Event()
        with anyio.move_on_after(self.probe_timeout_seconds):
            await conn.execute("SELECT pg_notify($1, $2)", self.channel, self.probe_payload)
            await self._probe_heard.wait()
            return True
        log.warning("LISTEN probe not heard back in %.1fs; reconnecting", self.probe_timeout_seconds)
        return False
