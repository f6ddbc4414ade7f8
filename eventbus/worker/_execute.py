"""Running one delivery: decode, call the handler, and turn what happened into a result.

This is the hook point for observability: the tracker wraps every handler
call. Nothing here writes results: a transactional handler's connection is
handed in by ``_transact``, which owns its transaction.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

import anyio

from ..backends.base import ClaimedDelivery, Completion, Failure
from ..context import Context
from ..errors import DecodeError, HandlerTimeout
from ..event import Event
from ..observe import DeliveryTracker
from ..retry import Outcome
from ..router import Subscription, decode_claimed

if TYPE_CHECKING:
    from ..bus import Bus

__all__ = ["Executor"]


def _cancelling_this_task() -> bool:
    """Whether the running task itself is being cancelled (a stop, a timeout).

    A CancelledError can also come out of something a handler awaited (a
    future another task cancelled): that one is the handler's failure.
    """
    if anyio.current_effective_deadline() == -math.inf:
        return True  # an enclosing cancel scope was cancelled
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio: cancellation only comes from scopes
        return False
    return task is not None and task.cancelling() > 0


class Executor:
    """Runs a claimed delivery's handler and returns its :class:`Completion` or :class:`Failure`."""

    def __init__(self, bus: Bus, worker_id: str, tracker: DeliveryTracker) -> None:
        self.bus = bus
        self.worker_id = worker_id
        self.tracker = tracker

    async def invoke(
        self, sub: Subscription, delivery: ClaimedDelivery, started: float, connection: Any = None
    ) -> Completion | Failure:
        """Run the handler; with a ``connection`` (a transactional handler), as ``ctx.connection``."""
        try:
            event = decode_claimed(sub, delivery, self.bus.max_payload_bytes)
        except DecodeError as exc:
            return self.failure(sub, delivery, exc, started, dead=True)
        ctx = Context(delivery, sub.name, self.bus.outgoing, self.bus.workflows.prepare, connection)
        try:
            timed_out = await self.call(sub, event, ctx)
            if ctx.starts and not timed_out and connection is None:
                # so a run's first step fans out, as bus.workflows.start does (a
                # transactional handler's machines are registered before its transaction)
                await self.bus.workflows.ensure_registered([s.machine for s in ctx.starts])
        except Exception as exc:
            return self.failure(sub, delivery, exc, started)
        except anyio.get_cancelled_exc_class() as exc:
            if _cancelling_this_task():
                raise  # the worker is stopping: hand the delivery back
            # A CancelledError of something the handler awaited: its failure.
            return self.failure(sub, delivery, exc, started)
        if timed_out:
            timeout = HandlerTimeout(f"handler ran past its timeout of {sub.timeout_seconds}s")
            return self.failure(sub, delivery, timeout, started)
        return Completion(delivery.id, delivery.lease_token, tuple(ctx.follow_ups), tuple(ctx.starts))

    async def call(self, sub: Subscription, event: Event, ctx: Context) -> bool:
        """Run the handler (inside the hooks' context); return True when it ran past its timeout."""
        entered, error = self.tracker.enter(ctx), None
        try:
            handler = sub.handler
            assert handler is not None  # a worker serves only subscriptions with a handler
            if sub.timeout_seconds is None:  # no cancel scope on the hot path
                await handler(event, ctx)
                return False
            with anyio.move_on_after(sub.timeout_seconds) as scope:
                await handler(event, ctx)
            return scope.cancelled_caught
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.tracker.exit(ctx, entered, error)

    async def before_transaction(self) -> None:
        """What a transactional handler needs written before its transaction opens: the step
        subscriptions of the bus's machines (its ``ctx.start`` runs fan out in the transaction,
        which on SQLite holds the only writer)."""
        await self.bus.workflows.ensure_registered(list(self.bus.workflows.machines))

    def failure(
        self,
        sub: Subscription,
        delivery: ClaimedDelivery,
        exc: BaseException,
        started: float,
        *,
        dead: bool = False,
    ) -> Failure:
        fate = Outcome(dead=True) if dead else sub.retry.outcome(exc, delivery.attempts)
        return Failure.of(
            delivery,
            exc,
            dead=fate.dead,
            retry_delay_seconds=fate.delay_seconds,
            duration_seconds=time.monotonic() - started,
            worker_id=self.worker_id,
            subscription=sub.name,
        )
