"""Live updates: a server-sent event stream that says when to refresh.

It looks at the status every ``interval`` seconds and sends ``refresh``
when the counts changed, so a page refreshes its panels only when there is
something new; a comment line every look keeps proxies from closing it. The
stream ends after ``max_seconds`` (the browser's EventSource reconnects).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..errors import ConfigurationError, EventBusError
from ._render import STALE_WORKER_SECONDS, Pages

__all__ = ["endpoint", "stream_seconds"]

MAX_STREAM_SECONDS = 300.0


async def fingerprint(p: Pages) -> str:
    report = await p.bus.status(window=p.count_cap)
    state = [report.events, sorted((r.subscription, r.status, r.count) for r in report.rows)]
    gone = {w.id for w in report.workers if w.silent_seconds > STALE_WORKER_SECONDS}
    state.append(sorted((w.id, w.listener_ok, w.id in gone) for w in report.workers))
    return hashlib.sha256(msgspec.json.encode(state)).hexdigest()[:16]


async def stream(p: Pages, interval: float, max_seconds: float) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    last = None
    with anyio.move_on_after(max_seconds):
        while True:
            try:
                now = await fingerprint(p)
            except EventBusError as exc:
                yield f"event: trouble\ndata: {type(exc).__name__}\n\n"
                now = None
            if last is not None and now is not None and now != last:
                yield "event: refresh\ndata: {}\n\n"
            else:
                yield ": idle\n\n"
            last = now if now is not None else last
            await anyio.sleep(interval)


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


def endpoint(p: Pages, interval: float) -> Callable[[Request], Awaitable[Response]]:
    async def live(request: Request) -> Response:
        max_seconds = stream_seconds(request.query_params.get("max_seconds"))
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            stream(p, interval, max_seconds), media_type="text/event-stream", headers=headers
        )

    return live
