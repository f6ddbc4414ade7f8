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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from .backends.base import OutgoingEvent
from .errors import BackendUnavailable, PublishError
from .types import PublishResult

__all__ = ["DEFAULT_MAX_BATCH", "PublishCoalescer"]

DEFAULT_MAX_BATCH = 500

Flush = Callable[[Sequence[OutgoingEvent]], Awaitable[list[PublishResult]]]
Waiter = tuple[OutgoingEvent, "asyncio.Future[PublishResult]"]


class PublishCoalescer:
    """Batches concurrent single publishes into one backend call at a time."""

    def __init__(self, flush: Flush, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self._flush = flush
        self.max_batch = max_batch
        self._waiting: list[Waiter] = []
        self._busy = False
        self._drainer: asyncio.Task[None] | None = None

    async def publish(self, event: OutgoingEvent) -> PublishResult:
        if self._busy:  # a flush is in flight: ride along in the next one
            future: asyncio.Future[PublishResult] = asyncio.get_running_loop().create_future()
            self._waiting.append((event, future))
            return await future
        self._busy = True  # nothing in flight: send this one now, alone
        try:
            (result,) = await self._flush([event])
            return result
        finally:
            self._after_flush()

    def _after_flush(self) -> None:
        """Hand the callers that queued meanwhile to a drainer, or go idle."""
        if self._waiting:
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        else:
            self._busy = False

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = [(e, f) for e, f in self._waiting[: self.max_batch] if not f.done()]
                del self._waiting[: self.max_batch]
                if batch:
                    await self._send(batch)
        finally:
            self._busy = False
            self._drainer = None
            if self._waiting:  # cancelled mid-drain: nobody may be left hanging
                _fail(self._waiting, BackendUnavailable("the bus was closed before this publish was sent"))
                self._waiting.clear()

    async def _send(self, batch: list[Waiter]) -> None:
        try:
            results = await self._flush([e for e, _ in batch])
        except asyncio.CancelledError:
            _fail(batch, BackendUnavailable("the bus was closed before this publish was confirmed"))
            raise
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
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():  # else its caller was cancelled meanwhile
                future.set_result(result)

    async def aclose(self) -> None:
        """Let the batch in flight finish (its callers are waiting for it)."""
        drainer = self._drainer
        if drainer is not None:
            await asyncio.shield(drainer)


def _fail(batch: list[Waiter], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
