"""Concurrent publishes of one process share one statement and one commit.

A publish that finds no flush in flight is sent at once, alone: a lone caller
never waits for a timer or for company. Publishes that arrive while a flush is
in flight queue up and go together in the next one (at most ``max_batch``
events), so under load the callers pay one round trip and one commit per
batch instead of one each, and none waits longer than the flush in flight
before its own is sent.

Each caller gets its own result. When a batch is refused for a reason other
than availability (one event the database will not take), its members are
sent again one by one, so only the culprit's caller gets the error.

Cancellation: a caller cancelled while its event waits in the queue takes it
out (it is never published); one cancelled while its event is in a statement
already sent cannot take it back, so it waits for that statement and is told
its result (published, or the error), and the cancellation is not raised
there (an anyio cancel scope delivers it at the caller's next checkpoint).

A flush that waits too long for a row lock (``LockWaitExceeded``: an event's
key inserted by another transaction still open) published nothing; its
members are sent again each on its own with ``fallback``, which waits as long
as it takes, while the queue goes on without them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import anyio

from .backends.base import LockWaitExceeded, OutgoingEvent
from .errors import BackendUnavailable, PublishError
from .types import PublishResult

__all__ = ["DEFAULT_MAX_BATCH", "PublishCoalescer"]

DEFAULT_MAX_BATCH = 500

Flush = Callable[[Sequence[OutgoingEvent]], Awaitable[list[PublishResult]]]


class _Waiter:
    """A queued publish: its event, the future its caller waits on, whether a flush took it."""

    __slots__ = ("event", "future", "outcome", "sent")

    def __init__(self, event: OutgoingEvent, future: asyncio.Future[PublishResult]) -> None:
        self.event = event
        self.future = future
        self.sent = False
        self.outcome: PublishResult | BaseException | None = None
        """The statement's outcome, kept when it came after the caller's cancel."""

    def done(self) -> bool:
        return self.future.done()

    def settle(self, outcome: PublishResult | BaseException) -> None:
        """Tell the caller; a caller cancelled meanwhile reads ``outcome`` instead."""
        if self.future.done():
            self.outcome = outcome
        elif isinstance(outcome, BaseException):
            self.future.set_exception(outcome)
        else:
            self.future.set_result(outcome)


class PublishCoalescer:
    """Batches concurrent single publishes into one backend call at a time.

    :param flush: sends one batch at a time, waiting a bounded time for row
        locks (``DeliveryStore.publish_serial``).
    :param fallback: sends an event whose flush gave up on a row lock, waiting
        as long as it takes (``DeliveryStore.publish``); by default ``flush``.
    """

    def __init__(
        self, flush: Flush, max_batch: int = DEFAULT_MAX_BATCH, fallback: Flush | None = None
    ) -> None:
        self._flush = flush
        self._fallback = fallback or flush
        self.max_batch = max_batch
        self._waiting: list[_Waiter] = []
        self._busy = False
        self._drainer: asyncio.Task[None] | None = None
        self._blocked: set[asyncio.Task[None]] = set()

    async def publish(self, event: OutgoingEvent) -> PublishResult:
        if self._busy:  # a flush is in flight: ride along in the next one
            return await self._queued(event)
        self._busy = True  # nothing in flight: send this one now, alone
        try:
            (result,) = await self._flush([event])
            return result
        except LockWaitExceeded:
            pass  # its key is held by an open transaction: wait for it off the queue
        finally:
            self._after_flush()
        (result,) = await self._fallback([event])
        return result

    async def _queued(self, event: OutgoingEvent) -> PublishResult:
        """Wait for the flush that takes ``event``; a cancel before it is sent withdraws it."""
        waiter = _Waiter(event, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if not waiter.sent:  # withdrawn: it is not published
                raise
        return await _outcome(waiter)

    def _after_flush(self) -> None:
        """Hand the callers that queued meanwhile to a drainer, or go idle."""
        if self._waiting:
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        else:
            self._busy = False

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = [w for w in self._waiting[: self.max_batch] if not w.done()]
                del self._waiting[: self.max_batch]
                for waiter in batch:
                    waiter.sent = True
                if batch:
                    await self._send(batch)
        finally:
            self._busy = False
            self._drainer = None
            if self._waiting:  # cancelled mid-drain: nobody may be left hanging
                _fail(self._waiting, BackendUnavailable("the bus was closed before this publish was sent"))
                self._waiting.clear()

    async def _send(self, batch: list[_Waiter]) -> None:
        try:
            results = await self._flush([w.event for w in batch])
        except asyncio.CancelledError:
            _fail(batch, BackendUnavailable("the bus was closed before this publish was confirmed"))
            raise
        except LockWaitExceeded:
            for member in batch:
                self._send_blocked(member)
            return
        except BackendUnavailable as exc:
            _fail(batch, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            for member in batch:  # isolate the event the database refused
                await self._send([member])
            return
        if len(results) != len(batch):  # never expected; no caller may be left waiting
            _fail(batch, PublishError(f"the backend returned {len(results)} results for {len(batch)} events"))
            return
        for waiter, result in zip(batch, results, strict=True):  # settle(), inlined: once per event
            if waiter.future.done():
                waiter.outcome = result
            else:
                waiter.future.set_result(result)

    def _send_blocked(self, waiter: _Waiter) -> None:
        """Send one member of a batch that gave up on a row lock on its own, outside the queue."""
        task = asyncio.get_running_loop().create_task(self._send_alone(waiter))
        self._blocked.add(task)
        task.add_done_callback(self._blocked.discard)

    async def _send_alone(self, waiter: _Waiter) -> None:
        try:
            (result,) = await self._fallback([waiter.event])
        except asyncio.CancelledError:
            _fail([waiter], BackendUnavailable("the bus was closed before this publish was confirmed"))
            raise
        except Exception as exc:
            _fail([waiter], exc)
            return
        waiter.settle(result)

    async def aclose(self) -> None:
        """Let the publishes in flight finish (their callers are waiting for them)."""
        drainer = self._drainer
        if drainer is not None:
            await asyncio.shield(drainer)
        if self._blocked:
            await asyncio.shield(asyncio.gather(*self._blocked, return_exceptions=True))


def _fail(batch: list[_Waiter], exc: BaseException) -> None:
    for waiter in batch:
        waiter.settle(exc)


async def _outcome(waiter: _Waiter) -> PublishResult:
    """The outcome of a sent event for a caller cancelled meanwhile: it waits for it, uncancellable."""
    if waiter.outcome is None:
        if waiter.future.done() and not waiter.future.cancelled():  # settled just before the cancel
            return waiter.future.result()
        # Not known yet: the flush will settle this future.
        waiter.future = asyncio.get_running_loop().create_future()
        with anyio.CancelScope(shield=True):  # an anyio scope redelivers after: no spinning here
            while True:
                try:
                    return await asyncio.shield(waiter.future)
                except asyncio.CancelledError:
                    continue
    outcome = waiter.outcome
    if isinstance(outcome, BaseException):
        raise outcome
    assert outcome is not None  # settled before the caller came back for it
    return outcome
