"""Worker application of the result-path process tests (tests/contract/deliveries/test_results.py).

Run as ``eventbus worker tests.apps.results_app:bus``; the bus comes from
``EVENTBUS_DSN`` / ``EVENTBUS_SCHEMA``. ``results.cancelled`` events reach a
handler that lets a ``CancelledError`` of something it awaited escape (as a
client library whose request was cancelled would); ``results.fine`` events
reach a handler that succeeds, so a test can see the worker keep serving.
"""

from __future__ import annotations

import asyncio

from eventbus import Bus, Context, Event, RetryPolicy


class Cancelled(Event, event_type="results.cancelled"):
    n: int


class Fine(Event, event_type="results.fine"):
    n: int


bus = Bus()


@bus.subscribe(
    Cancelled, name="cancelled", retry=RetryPolicy(max_attempts=2, base_delay_seconds=0.0, jitter=0.0)
)
async def cancelled(event: Cancelled, ctx: Context) -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    loop.call_soon(future.cancel)
    await future


@bus.subscribe(Fine, name="fine")
async def fine(event: Fine, ctx: Context) -> None:
    pass
