"""Helpers for testing handlers against a real bus.

A temporary bus lives in a fresh SQLite file (or a fresh PostgreSQL schema)
and is deleted afterwards; :func:`drain` runs handlers until nothing is left
to run; :func:`drain_throughput` times a drain of a published backlog (what
``eventbus bench`` reports). The bus's own tests and benchmarks use the same
helpers::

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

from .bus import Bus, Envelope
from .context import Context
from .event import Event
from .router import Router
from .worker import Worker

__all__ = ["BenchEvent", "Drained", "Throughput", "drain", "drain_throughput", "temporary_bus"]


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
        if not wait_for_scheduled:
            return Drained(processed=processed, rounds=rounds)
        delay = await _next_due_in(bus, worker_options.get("subscriptions"))
        if delay is None:
            return Drained(processed=processed, rounds=rounds)
        if time.monotonic() + delay > deadline:
            raise TimeoutError(f"deliveries are still scheduled {delay:.1f}s from now after {timeout}s")
        await anyio.sleep(max(delay, 0.005))


async def _next_due_in(bus: Bus, names: list[str] | None) -> float | None:
    """Seconds until the earliest pending delivery of the bus's pushed subscriptions is due.

    A subscription without a handler (``bus.pull``) is left to the code that claims it.
    """
    pushed = [s.name for s in bus.subscriptions.values() if s.handler is not None]
    ids = await bus.register([n for n in pushed if names is None or n in names])
    delays = [d for i in ids.values() if (d := await bus.backend.deliveries.next_run_in(i)) is not None]
    return min(delays, default=None)


class BenchEvent(Event, event_type="bench.tick"):
    """The event benchmarks publish: a number and an optional body."""

    n: int
    body: str = ""


class Throughput(msgspec.Struct, frozen=True):
    """What a :func:`drain_throughput` run measured, with its settings."""

    backend: str
    n: int
    subscriptions: int
    concurrency: int
    batch_size: int
    handler_sleep_seconds: float
    ordering_keys: int
    publish_per_second: float
    """Events published per second, in batches of ``publish_batch``."""
    deliveries_per_second: float
    """Deliveries drained per second by one burst worker."""
    transactional: bool = False
    """The handlers were transactional (``subscribe(..., transactional=True)``)."""


async def drain_throughput(
    dsn: str | None,
    n: int = 20_000,
    *,
    concurrency: int = 200,
    batch_size: int = 100,
    subscriptions: int = 1,
    handler_sleep_seconds: float = 0.0,
    publish_batch: int = 1000,
    ordering_keys: int = 0,
    transactional: bool = False,
    rollup: bool = True,
) -> Throughput:
    """Publish ``n`` :class:`BenchEvent` on a :func:`temporary_bus`, then time one :func:`drain` of them.

    ``subscriptions`` handlers (each sleeping ``handler_sleep_seconds``) take
    every event. With ``ordering_keys``, the subscriptions are ordered and
    event ``i`` has ordering key ``i % ordering_keys`` (each key's events
    spread over the log). With ``transactional``, the handlers are
    transactional (each delivery completes in a transaction of its own, which
    the handler could write in). Planner statistics are refreshed before the
    drain, as autovacuum would in steady state. ``rollup``: the bus's workers
    keep the throughput rollup (``Bus(rollup=…)``).
    """
    pool: dict[str, Any] = {} if dsn is None or dsn.startswith("sqlite:") else {"max_pool_size": 8}
    async with temporary_bus(dsn, rollup=rollup, **pool) as bus:
        _subscribe_bench(
            bus, subscriptions, handler_sleep_seconds, ordered=ordering_keys > 0, transactional=transactional
        )
        await bus.register()  # subscriptions exist before publishing: no backfill
        published = await _publish_bench(bus, n, publish_batch, ordering_keys)
        await bus.backend.schema.analyze()
        started = time.perf_counter()
        await drain(bus, wait_for_scheduled=False, concurrency=concurrency, batch_size=batch_size)
        drained = time.perf_counter() - started
        return Throughput(
            backend=bus.backend.kind,
            n=n,
            subscriptions=subscriptions,
            concurrency=concurrency,
            batch_size=batch_size,
            handler_sleep_seconds=handler_sleep_seconds,
            ordering_keys=ordering_keys,
            publish_per_second=n / published,
            deliveries_per_second=n * subscriptions / drained,
            transactional=transactional,
        )


def _subscribe_bench(
    bus: Bus, count: int, sleep_seconds: float, *, ordered: bool, transactional: bool = False
) -> None:
    """``count`` subscriptions to :class:`BenchEvent` named ``bench-0`` and on."""

    async def handler(event: BenchEvent, ctx: Context) -> None:
        if sleep_seconds:
            await anyio.sleep(sleep_seconds)

    for i in range(count):
        bus.subscribe(BenchEvent, name=f"bench-{i}", ordered=ordered, transactional=transactional)(handler)


async def _publish_bench(bus: Bus, n: int, batch: int, ordering_keys: int) -> float:
    """Publish ``n`` :class:`BenchEvent` in batches; the seconds it took."""
    started = time.perf_counter()
    for start in range(0, n, batch):
        await bus.publish_many(
            Envelope(BenchEvent(n=i), ordering_key=f"k{i % ordering_keys}" if ordering_keys else None)
            for i in range(start, min(n, start + batch))
        )
    return time.perf_counter() - started
