"""Worker application of the per-key order tests (ordered subscriptions).

Run as ``eventbus worker tests.apps.ordered_app:bus``; the bus comes from
``EVENTBUS_DSN`` / ``EVENTBUS_SCHEMA``. Tests build their own bus and
``include(router)`` to publish and inspect. Steered by env vars:

``ORD_RECORDS``       the record file (required by the handler)
``ORD_LEASE``         lease seconds (default 2)
``ORD_SLOW_SEQ``      the event ``seq`` whose first attempt sleeps ``ORD_SLOW_SECONDS``
``ORD_SLOW_SECONDS``  default 60
``ORD_JITTER_MS``     each run sleeps up to this many milliseconds (default 0)

Each run appends ``phase key seq attempt pid`` (phase ``start`` or ``done``)
to the one record file shared by every process, with one ``write(2)`` on an
``O_APPEND`` descriptor: lines of all processes land in the order they were
written, and a key's next delivery is claimed only after its previous one's
``done`` line and completion, so each key's lines are its handling order.
"""

from __future__ import annotations

import asyncio
import os
import random

from eventbus import Bus, Context, Event, RetryPolicy, Router


class Step(Event, event_type="order.step"):
    key: str
    seq: int


LEASE = float(os.environ.get("ORD_LEASE", 2.0))
SLOW_SEQ = int(os.environ.get("ORD_SLOW_SEQ", -1))
SLOW_SECONDS = float(os.environ.get("ORD_SLOW_SECONDS", 60.0))
JITTER_MS = float(os.environ.get("ORD_JITTER_MS", 0.0))

router = Router()
_fd: int | None = None


def record(phase: str, event: Step, ctx: Context) -> None:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["ORD_RECORDS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{phase} {event.key} {event.seq} {ctx.attempt} {os.getpid()}\n".encode())


@router.subscribe(
    Step,
    name="fifo",
    ordered=True,
    lease_seconds=LEASE,
    retry=RetryPolicy(max_attempts=5, base_delay_seconds=0.2, jitter=0.0),
)
async def on_step(event: Step, ctx: Context) -> None:
    record("start", event, ctx)
    if event.seq == SLOW_SEQ and ctx.attempt == 1:
        await asyncio.sleep(SLOW_SECONDS)
    if JITTER_MS:
        await asyncio.sleep(random.uniform(0, JITTER_MS) / 1000)
    record("done", event, ctx)


bus = Bus()
bus.include(router)


def read_records(path: str) -> list[tuple[str, str, int, int, int]]:
    """(phase, key, seq, attempt, pid) per line, in file order."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        phase, key, seq, attempt, pid = line.split()
        out.append((phase, key, int(seq), int(attempt), int(pid)))
    return out
