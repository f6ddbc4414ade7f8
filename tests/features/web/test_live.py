"""The live stream is fed by the bus's change hints (LISTEN, commits to the file), not by pages polling."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest

from eventbus import Bus, Context, Worker
from eventbus.backends.ports import ChangeFeed
from eventbus.web import create_app

from ...conftest import BusFactory, Target
from ...support.databases import drop_schema
from ...support.helpers import OrderPlaced
from .conftest import ORIGIN

Publish = Callable[[], Awaitable[Any]]
LONG = 60.0
"""A fallback look this far apart never happens during a test: what the stream says came from a hint."""


async def _stream(client: httpx.AsyncClient, seconds: float, publish_after: float, publish: Publish) -> str:
    """The body of a ``seconds`` long stream, with ``publish`` called ``publish_after`` seconds in.

    The test transport hands the body over when the stream ends: a refresh in
    it came less than ``seconds - publish_after`` after the publish.
    """

    async def later() -> None:
        await anyio.sleep(publish_after)
        await publish()

    with anyio.fail_after(seconds + 5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            r = await client.get(f"/live?max_seconds={seconds}")
    assert r.headers["content-type"].startswith("text/event-stream")
    return r.text


async def _nothing() -> None:
    pass


async def test_a_publish_elsewhere_refreshes_an_open_stream(seeded: Bus, make_bus: BusFactory) -> None:
    other = await make_bus()
    app = create_app(seeded, live_interval=0.05, live_fallback=LONG)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
        body = await _stream(client, 2.0, 0.3, lambda: other.publish(OrderPlaced(order_id="elsewhere")))
        assert body.startswith("retry:") and "event: refresh" in body
        quiet = await _stream(client, 0.8, 0.0, _nothing)
    assert "event: refresh" not in quiet  # connecting is no change


async def test_many_streams_share_one_watcher_and_each_hears_the_change(
    seeded: Bus, make_bus: BusFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = await make_bus()
    feeds: list[ChangeFeed] = []
    changes = seeded.changes

    def counted() -> ChangeFeed:
        feeds.append(changes())
        return feeds[-1]

    monkeypatch.setattr(seeded, "changes", counted)
    app = create_app(seeded, live_interval=0.05, live_fallback=LONG)
    bodies: list[str] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:

        async def one(publish: Publish) -> None:
            bodies.append(await _stream(client, 2.0, 0.3, publish))

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one, _nothing)
            tg.start_soon(one, lambda: other.publish(OrderPlaced(order_id="for-all")))
    assert len(bodies) == 5 and all("event: refresh" in b for b in bodies)
    assert len(feeds) == 1  # one watcher (one LISTEN connection) for the five pages


async def test_a_worker_still_wakes_at_once_while_a_stream_is_open(seeded: Bus, make_bus: BusFactory) -> None:
    """The dashboard's watcher has its own source: the worker's wake-ups are not taken from it."""
    done = anyio.Event()
    worker_bus = await make_bus()

    @worker_bus.subscribe(OrderPlaced, name="wake-test")
    async def handle(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id == "wake-me":
            done.set()

    other = await make_bus()
    worker = Worker(worker_bus, poll_interval_seconds=LONG)
    app = create_app(seeded, live_interval=0.05, live_fallback=LONG)
    took: list[float] = []

    async def publish() -> None:
        with anyio.fail_after(5):
            while worker.phase != "serving" or not getattr(worker_bus.backend.wakeups, "healthy", True):
                await anyio.sleep(0.02)
        started = time.monotonic()
        await other.publish(OrderPlaced(order_id="wake-me"))
        with anyio.fail_after(5):
            await done.wait()
        took.append(time.monotonic() - started)

    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(worker.run)
        body = await _stream(client, 3.0, 0.3, publish)
        worker.stop()
    assert "event: refresh" in body and took[0] < 2.0


async def test_a_failing_look_is_told_to_the_stream_as_trouble(pg_target: Target) -> None:
    """The bus's tables vanish under an open page: the stream says so instead of going quiet."""
    bus = pg_target.bus(migrate=True)
    await bus.migrate()
    app = create_app(bus, live_interval=0.05, live_fallback=0.2)

    async def drop() -> None:
        await drop_schema(pg_target.dsn, str(pg_target.schema))

    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
            body = await _stream(client, 1.5, 0.3, drop)
    finally:
        await bus.aclose()
    assert "event: trouble\ndata: " in body
