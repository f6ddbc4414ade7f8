"""Worker application of the SQLite fault tests (tests/faults/sqlite).

Run as ``eventbus worker tests.apps.sqlite_app:bus``; the bus comes from
``EVENTBUS_DSN`` (a ``sqlite:///…`` file). Steered by env vars:

``SQ_RECORDS``        directory of the run records (required by every handler)
``SQ_LEASE``          lease seconds of every subscription (default 2)
``SQ_SLEEP``          seconds the ``job`` handler sleeps (default 0)
``SQ_HANG_SECONDS``   seconds the ``hang`` handler sleeps (default 0)

Every handler run is recorded before and after its work as one line
``pid phase subscription delivery_id event_id attempt`` appended, with one
``write(2)`` on an ``O_APPEND`` descriptor, to ``$SQ_RECORDS/<pid>.runs``: a
line whose write returned survives a SIGKILL of the process (it is in the
kernel's page cache), and the file is kept apart from the bus's database so
the records never contend for its write lock. A handler that sees an
exception records ``error`` with it before re-raising.

The ``audit`` handler publishes a ``Note`` through the same bus, so the
publish path is exercised from inside handlers under write contention.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from eventbus import Bus, Context, Event

from .sqlite_events import Audit, FollowUp, Hang, Job, Note

LEASE = float(os.environ.get("SQ_LEASE", 2.0))
SLEEP = float(os.environ.get("SQ_SLEEP", 0.0))
HANG = float(os.environ.get("SQ_HANG_SECONDS", 0.0))

bus = Bus()

_fd: int | None = None


def record(ctx: Context, phase: str, detail: str = "") -> None:
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["SQ_RECORDS"], f"{os.getpid()}.runs")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = (
        f"{os.getpid()} {phase} {ctx.subscription} {ctx.delivery_id} {ctx.event_id} "
        f"{ctx.attempt} {detail.replace(chr(10), ' ')}"
    )
    os.write(_fd, (line.rstrip() + "\n").encode())


def recorded(fn: Callable[[Any, Context], Awaitable[None]]) -> Callable[[Any, Context], Awaitable[None]]:
    async def handler(event: Event, ctx: Context) -> None:
        record(ctx, "start")
        try:
            await fn(event, ctx)
        except BaseException as exc:
            record(ctx, "error", f"{type(exc).__name__}: {exc}")
            raise
        record(ctx, "end")

    handler.__annotations__ = fn.__annotations__
    handler.__name__ = fn.__name__
    return handler


@bus.subscribe(Job, name="job", lease_seconds=LEASE)
@recorded
async def on_job(event: Job, ctx: Context) -> None:
    if SLEEP:
        await asyncio.sleep(SLEEP)
    ctx.emit(FollowUp(parent=f"job:{ctx.key}"), key=f"f:{ctx.key}")


@bus.subscribe(Audit, name="audit", lease_seconds=LEASE)
@recorded
async def on_audit(event: Audit, ctx: Context) -> None:
    await bus.publish(Note(parent=f"audit:{ctx.key}"), key=f"n:{ctx.key}")


@bus.subscribe(FollowUp, name="followup", lease_seconds=LEASE)
@recorded
async def on_followup(event: FollowUp, ctx: Context) -> None:
    pass


@bus.subscribe(Note, name="note", lease_seconds=LEASE)
@recorded
async def on_note(event: Note, ctx: Context) -> None:
    pass


@bus.subscribe(Hang, name="hang", lease_seconds=LEASE)
@recorded
async def on_hang(event: Hang, ctx: Context) -> None:
    await asyncio.sleep(HANG)
    ctx.emit(FollowUp(parent=f"hang:{ctx.key}"), key=f"hang:{ctx.key}")
