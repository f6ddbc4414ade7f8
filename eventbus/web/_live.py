"""Live updates: a server-sent event stream that says when to refresh.

One :class:`Fanout` per application watches the bus for every open stream:
a single task waits on the bus's change feed (:meth:`~eventbus.Bus.changes`:
on PostgreSQL a LISTEN connection of its own, on SQLite a look at the file's
commit counter) and, every ``fallback`` seconds without a hint, compares a
fingerprint of the status once (what is never hinted: completions, a worker
going silent). Each change is told to every stream, which sends ``refresh``
at most once per ``interval`` seconds; a comment line now and then keeps
proxies from closing it. The task starts with the first stream and ends
with the last. A stream ends after ``max_seconds`` (the browser's
EventSource reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..bus import Bus
from ..errors import ConfigurationError, EventBusError
from ._render import STALE_WORKER_SECONDS

__all__ = ["DEFAULT_FALLBACK_SECONDS", "Fanout", "endpoint", "stream_seconds"]

MAX_STREAM_SECONDS = 300.0
DEFAULT_FALLBACK_SECONDS = 5.0
"""Seconds without a hint after which the status is compared anyway."""
KEEPALIVE_SECONDS = 15.0

log = logging.getLogger("eventbus.web")


async def fingerprint(bus: Bus, window: int | None = None) -> str:
    report = await bus.status(window=window)
    state = [report.events, sorted((r.subscription, r.status, r.count) for r in report.rows)]
    gone = {w.id for w in report.workers if w.silent_seconds > STALE_WORKER_SECONDS}
    state.append(sorted((w.id, w.listener_ok, w.id in gone) for w in report.workers))
    return hashlib.sha256(msgspec.json.encode(state)).hexdigest()[:16]


class Fanout:
    """The one watcher of a dashboard process, and what it tells the open streams.

    ``changes`` counts the changes seen, ``troubles`` the failed looks
    (``trouble`` names the last error type); a stream waits for either to move.
    """

    def __init__(self, bus: Bus, fallback: float, window: int | None = None) -> None:
        self.bus = bus
        self.window = window
        self.fallback = fallback
        self.changes = 0
        self.troubles = 0
        self.trouble = ""
        self.streams = 0
        self._moved = anyio.Event()
        self._task: asyncio.Task[None] | None = None

    def _tell(self) -> None:
        self._moved.set()
        self._moved = anyio.Event()

    async def _look(self, last: str | None) -> str | None:
        """The status's fingerprint now, telling a change from ``last``; ``last`` when the look failed."""
        try:
            now = await fingerprint(self.bus, self.window)
        except EventBusError as exc:
            self.troubles, self.trouble = self.troubles + 1, type(exc).__name__
            self._tell()
            return last
        if last is not None and now != last:
            self.changes += 1
            self._tell()
        return now

    async def _watch(self) -> None:
        feed = self.bus.changes()
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed.run, name="dashboard change feed")
            last = await self._look(None)
            while True:
                if await feed.changed(self.fallback):
                    self.changes += 1
                    self._tell()
                else:
                    last = await self._look(last)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())
            self._task.add_done_callback(_log_failure)

    async def wait(self, changes: int, troubles: int, timeout: float) -> None:
        """Return once ``changes`` or ``troubles`` moved, or after ``timeout``."""
        self._ensure_running()
        with anyio.move_on_after(timeout):
            while self.changes == changes and self.troubles == troubles:
                await self._moved.wait()

    @contextlib.asynccontextmanager
    async def joined(self) -> AsyncIterator[Fanout]:
        """Count one stream in for as long as it runs; the last one out stops the watcher."""
        self.streams += 1
        self._ensure_running()
        try:
            yield self
        finally:
            self.streams -= 1
            if self.streams == 0 and self._task is not None:
                self._task.cancel()
                self._task = None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("the live updates' watcher failed (the next stream starts it again)", exc_info=exc)


async def stream(fan: Fanout, interval: float, max_seconds: float) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    async with fan.joined():
        changes, troubles = fan.changes, fan.troubles
        sent = -math.inf
        yield ": idle\n\n"
        with anyio.move_on_after(max_seconds):
            while True:
                await fan.wait(changes, troubles, KEEPALIVE_SECONDS)
                if fan.troubles != troubles:
                    troubles = fan.troubles
                    yield f"event: trouble\ndata: {fan.trouble}\n\n"
                if fan.changes == changes:
                    yield ": idle\n\n"
                    continue
                await anyio.sleep(max(0.0, sent + interval - anyio.current_time()))  # one per interval
                changes, sent = fan.changes, anyio.current_time()
                yield "event: refresh\ndata: {}\n\n"


def stream_seconds(given: str | None) -> float:
    """How long a stream may run: ``given`` seconds, at most :data:`MAX_STREAM_SECONDS`.

    Anything but a number from 0 up (``nan``, ``-1``, ``soon``) is a
    :class:`~eventbus.errors.ConfigurationError`, shown as a 400.
    """
    if given is None:
        return MAX_STREAM_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # NaN compares false
        raise ConfigurationError(f"max_seconds must be a number of seconds from 0 up, got {given[:40]!r}")
    return min(seconds, MAX_STREAM_SECONDS)


def endpoint(fan: Fanout, interval: float) -> Callable[[Request], Awaitable[Response]]:
    async def live(request: Request) -> Response:
        max_seconds = stream_seconds(request.query_params.get("max_seconds"))
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            stream(fan, interval, max_seconds), media_type="text/event-stream", headers=headers
        )

    return live
