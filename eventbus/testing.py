"""Helpers for testing handlers against a real bus.

A temporary bus lives in a fresh SQLite file (or a fresh PostgreSQL schema)
and is deleted afterwards; :func:`drain` runs handlers until nothing is left
to run. The bus's own tests and benchmarks use the same helpers::

    from eventbus.testing import drain, temporary_bus

    async def test_charge_emits_a_payment() -> None:
        async with temporary_bus(router=app.bus) as bus:
            await bus.publish(OrderPlaced(order_id="o-1"))
            await drain(bus)
            ...
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec

from .bus import Bus
from .router import Router
from .worker import Worker

__all__ = ["Drained", "drain", "temporary_bus"]


class Drained(msgspec.Struct, frozen=True):
    """What a :func:`drain` did."""

    processed: int
    """Deliveries completed (their completion committed)."""
    rounds: int
    """Burst runs it took (more than one when it waited for scheduled retries)."""


@contextlib.asynccontextmanager
async def temporary_bus(
    dsn: str | None = None, *, router: Router | None = None, **options: Any
) -> AsyncIterator[Bus]:
    """A migrated bus on a fresh SQLite file, or on a fresh schema of the PostgreSQL ``dsn``.

    ``router``'s subscriptions (an application's :class:`Bus` or
    :class:`Router`) are included. The file or schema is deleted on exit.
    """
    with contextlib.ExitStack() as stack:
        if dsn is None or dsn.startswith("sqlite:"):
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="eventbus-test-"))
            bus = Bus(f"sqlite:///{Path(folder) / 'bus.db'}", **options)
        else:
            options.setdefault("schema", f"eventbus_test_{uuid.uuid4().hex[:12]}")
            bus = Bus(dsn, **options)
        if router is not None:
            bus.include(router)
        try:
            await bus.migrate()
            yield bus
        finally:
            with anyio.CancelScope(shield=True):
                await bus.backend.schema.drop()
                await bus.aclose()


async def drain(
    bus: Bus, *, wait_for_scheduled: bool = True, timeout: float = 30.0, **worker_options: Any
) -> Drained:
    """Run the bus's handlers until nothing is runnable.

    With ``wait_for_scheduled`` (the default), deliveries scheduled for later
    (retries with a backoff, delayed publishes) are waited for and run too, up
    to ``timeout`` seconds; :class:`TimeoutError` if some are still due then.
    ``worker_options`` go to :class:`~eventbus.worker.Worker`.
    """
    deadline = time.monotonic() + timeout
    processed = rounds = 0
    while True:
        worker = Worker(bus, burst=True, **worker_options)
        await worker.run()
        processed, rounds = processed + worker.processed, rounds + 1
        delay = await _next_due_in(bus, worker_options.get("subscriptions"))
        if not wait_for_scheduled or delay is None:
            return Drained(processed=processed, rounds=rounds)
        if time.monotonic() + delay > deadline:
            raise TimeoutError(f"deliveries are still scheduled {delay:.1f}s from now after {timeout}s")
        await anyio.sleep(max(delay, 0.005))


async def _next_due_in(bus: Bus, names: list[str] | None) -> float | None:
    """Seconds until the earliest pending delivery of the bus's subscriptions is due."""
    ids = await bus.register(names)
    delays = [d for i in ids.values() if (d := await bus.backend.deliveries.next_run_in(i)) is not None]
    return min(delays, default=None)
