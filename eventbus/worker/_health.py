"""A worker's health, for liveness and readiness probes (Kubernetes, systemd, load balancers).

:func:`health` reads what the worker already tracks, with no database round
trip of its own, so a probe costs nothing and cannot pile up behind a busy
pool:

- **live**: the worker's run is in progress and its claim loop has taken a
  turn lately (or every slot is busy, so it has no reason to). A worker that
  fails this is stuck and should be restarted.
- **ready**: live, serving (registered, not starting, not draining after a
  stop), the database answered its last heartbeat recently, and it will hear
  of new work: the wake-up listener is connected, or the claim loop is
  polling on time. A worker that fails this should get no new traffic and
  needs attention, but restarting it would not help by itself.

:func:`serve_health` answers ``GET /livez`` and ``GET /readyz`` (``/healthz``
is ``/readyz``) over plain HTTP/1.1: 200 with a JSON body when the check
passes, 503 with the same body (which check failed, and why) when it does not.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.abc
import msgspec

if TYPE_CHECKING:
    from . import Worker

__all__ = ["WorkerHealth", "health", "serve_health"]

log = logging.getLogger("eventbus.worker")

Phase = Literal["starting", "serving", "stopping", "stopped"]

BEAT_STALE_SECONDS = 20.0
"""A heartbeat older than this (about four missed beats) means the database is not answering."""

STUCK_AFTER_SECONDS = 60.0
"""A claim loop with free slots that has not turned for this long (or ten polls, if longer) is stuck."""


class WorkerHealth(msgspec.Struct, frozen=True):
    """What a probe of one worker found: each check is ``"ok"`` or the reason it failed."""

    worker_id: str
    phase: Phase
    live: bool
    ready: bool
    checks: dict[str, str]


def health(worker: Worker, now: float | None = None) -> WorkerHealth:
    """The worker's liveness and readiness, from what it tracks (no I/O)."""
    now = time.monotonic() if now is None else now
    live_checks = {"running": _running(worker), "claim loop": _claim_loop(worker, now)}
    ready_checks = {
        "serving": "ok" if worker.phase == "serving" else f"worker is {worker.phase}",
        "database": _database(worker, now),
        "wake-ups": _wakeups(worker, now),
    }
    live = all(v == "ok" for v in live_checks.values())
    ready = live and all(v == "ok" for v in ready_checks.values())
    return WorkerHealth(worker.id, worker.phase, live, ready, {**live_checks, **ready_checks})


def _running(worker: Worker) -> str:
    return "ok" if worker.phase != "stopped" else "the worker's run has ended"


def _claim_loop(worker: Worker, now: float) -> str:
    claims = worker._claims
    if worker.phase != "serving" or claims.slots.running >= claims.slots.size:
        return "ok"  # starting, draining or full: the loop has no reason to turn
    idle = now - claims.turned_at
    limit = max(STUCK_AFTER_SECONDS, 10 * worker.poll_interval_seconds)
    return "ok" if idle <= limit else f"no claim turn for {idle:.0f}s with free slots"


def _database(worker: Worker, now: float) -> str:
    if worker.beat_at is None:
        return "no heartbeat written yet"
    age = now - worker.beat_at
    return "ok" if age <= BEAT_STALE_SECONDS else f"last heartbeat written {age:.0f}s ago"


def _wakeups(worker: Worker, now: float) -> str:
    """The listener is up, or the loop polls on time (every poll interval, plus slack)."""
    if getattr(worker.wakeups, "healthy", True):
        return "ok"
    claims = worker._claims
    late = now - claims.turned_at - worker.poll_interval_seconds
    if late <= 5.0 or claims.slots.running >= claims.slots.size:
        return "ok"
    return f"wake-up listener down and the poll is {late:.0f}s late"


_PATHS = {"/livez": "live", "/readyz": "ready", "/healthz": "ready"}


async def serve_health(
    worker: Worker,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer health probes of ``worker`` on ``host:port`` until cancelled.

    Started with ``task_group.start``, it reports the port it bound (useful
    with ``port=0``). ``OSError`` when the address cannot be bound.
    """
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    async with listener:
        bound = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started(bound)
        await listener.serve(lambda stream: _answer(worker, stream))


async def _answer(worker: Worker, stream: anyio.abc.SocketStream) -> None:
    async with stream:
        try:
            with anyio.fail_after(5):
                request = await _read_head(stream)
                await stream.send(_response(worker, request))
        except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return


async def _read_head(stream: anyio.abc.SocketStream) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < 8192:
        head += await stream.receive(4096)
    return head


def _response(worker: Worker, request: bytes) -> bytes:
    line = request.split(b"\n", 1)[0].decode("latin-1").split()
    method, path = (line[0], line[1].split("?", 1)[0]) if len(line) >= 2 else ("", "")
    if method not in ("GET", "HEAD") or path not in _PATHS:
        return _http(404, b'{"error": "not found: GET /livez, /readyz or /healthz"}', method == "HEAD")
    found = health(worker)
    ok = found.live if _PATHS[path] == "live" else found.ready
    return _http(200 if ok else 503, msgspec.json.encode(found), method == "HEAD")


def _http(status: int, body: bytes, head_only: bool) -> bytes:
    reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
    header = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    ).encode()
    return header if head_only else header + body
