"""Worker application of the shutdown tests (tests/integration/test_shutdown.py).

Run as ``eventbus worker tests.apps.lifecycle_app:bus`` on either backend; the
bus comes from ``EVENTBUS_DSN`` / ``EVENTBUS_SCHEMA``. Steered by env vars:

``LIFE_RECORDS``       directory of the run records (required)
``LIFE_LEASE``         lease seconds of every subscription (default 30)
``LIFE_SLOW_SECONDS``  seconds each ``slow`` handler sleeps (default 1)
``LIFE_MAX_ATTEMPTS``  max attempts of the ``stuck`` subscription (default 3)

``quick`` does nothing (a backlog of them drains fast), ``slow`` sleeps, and
``stuck`` never returns (a hung handler with no timeout). Each ``slow`` and
``stuck`` run appends ``pid subscription delivery_id attempt`` to
``$LIFE_RECORDS/<pid>.runs`` when it starts, with one ``write(2)`` on an
``O_APPEND`` descriptor, so a test can see runs from any process on both backends.
"""

from __future__ import annotations

import os

import anyio

from eventbus import Bus, Context, RetryPolicy

from .lifecycle_events import Quick, Slow, Stuck

LEASE = float(os.environ.get("LIFE_LEASE", 30.0))
SLOW = float(os.environ.get("LIFE_SLOW_SECONDS", 1.0))

bus = Bus()
_fd: int | None = None


def record(ctx: Context) -> None:
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["LIFE_RECORDS"], f"{os.getpid()}.runs")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{os.getpid()} {ctx.subscription} {ctx.delivery_id} {ctx.attempt}\n".encode())


@bus.subscribe(Quick, name="quick", lease_seconds=LEASE)
async def on_quick(event: Quick, ctx: Context) -> None:
    pass


@bus.subscribe(Slow, name="slow", lease_seconds=LEASE)
async def on_slow(event: Slow, ctx: Context) -> None:
    record(ctx)
    await anyio.sleep(SLOW)


@bus.subscribe(
    Stuck,
    name="stuck",
    lease_seconds=LEASE,
    retry=RetryPolicy(
        max_attempts=int(os.environ.get("LIFE_MAX_ATTEMPTS", 3)), base_delay_seconds=0.0, jitter=0.0
    ),
)
async def on_stuck(event: Stuck, ctx: Context) -> None:
    record(ctx)
    await anyio.sleep_forever()
