"""Pull claims: code that is not a handler takes deliveries itself (``bus.pull``).

A subscription declared without a handler (:meth:`Pull.subscription`) is
never served by a worker; an agent loop, a batch job or a script claims its
deliveries with :meth:`Pull.claim` and settles each one. Claims, results and
leases go through the same :class:`~eventbus.backends.base.DeliveryStore`
calls a worker makes, so the lease tokens, the fencing, the attempts, the
retry policy and the dead letters are those of pushed deliveries.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio

from .backends.base import ClaimedDelivery, Completion, DeliveryStore, Failure, OutgoingEvent
from .errors import ConfigurationError, DecodeError, NotFound
from .event import Event, check_upcasters, event_type_of
from .retry import Outcome, RetryPolicy, policy_with
from .router import Router, Subscription, decode_claimed
from .types import DeliveryDetail, DeliveryId, EventId

__all__ = ["MAX_CLAIM", "Batch", "ClaimFailed", "Pull", "PulledDelivery"]

MAX_CLAIM = 1000
"""The most deliveries one claim may take."""

Outgoing = Callable[..., OutgoingEvent]
"""How a follow-up event is encoded and checked (``bus.outgoing``)."""


class ClaimFailed(Exception):
    """The failure a caller of :meth:`PulledDelivery.fail` gave as text."""


class PulledDelivery:
    """One claimed delivery: its event, and the four ways to settle or keep it.

    Each method is fenced by the claim's lease token: once the lease is lost
    (it ran out and was recovered, or the delivery was cancelled) it changes
    nothing and returns False. A delivery settles once; a second settle
    returns False too.
    """

    def __init__(self, batch: Batch, delivery: ClaimedDelivery, event: Event) -> None:
        self._batch = batch
        self.delivery = delivery
        """The row as claimed (ids, attempt, lease token, payload, headers)."""
        self.event = event
        """The event, decoded as the subscription's class (older versions upcast)."""
        self.settled = False
        """Whether this delivery was completed, failed or released through this claim."""

    @property
    def id(self) -> DeliveryId:
        return self.delivery.id

    @property
    def event_id(self) -> EventId:
        return self.delivery.event_id

    @property
    def attempt(self) -> int:
        """1 on the first claim of this delivery."""
        return self.delivery.attempts

    @property
    def lease_token(self) -> str:
        return self.delivery.lease_token

    async def complete(self, follow_ups: Sequence[Event] = ()) -> bool:
        """Mark the delivery completed and publish ``follow_ups`` with it, in one transaction.

        The follow-ups are caused by this delivery's event (as ``ctx.emit``'s
        are) and are checked before anything is written (:class:`PublishError`).
        False, with nothing written, when the lease no longer holds.
        """
        out = [self._batch.follow_up(self.delivery, e) for e in follow_ups]
        if self.settled:
            return False
        self.settled = True
        completion = Completion(self.delivery.id, self.delivery.lease_token, tuple(out))
        return completion.lease in await self._batch.store.complete([completion])

    async def fail(self, error: BaseException | str, *, retry: bool = True) -> bool:
        """Record a failed attempt: retried by the subscription's policy, or dead.

        Dead when ``retry=False``, when the attempts are used up, or when
        ``error`` is a :class:`DeadLetter` or one of the policy's
        ``non_retryable``; a :class:`Retry` error picks its own delay. The
        attempt history shows ``error``'s type and message
        (:class:`ClaimFailed` for text). False when the lease no longer holds.
        """
        if self.settled:
            return False
        exc = ClaimFailed(error) if isinstance(error, str) else error
        if not isinstance(exc, BaseException):
            raise ConfigurationError(f"fail() takes an exception or a message, not {type(error).__name__}")
        sub = self._batch.subscription
        fate = Outcome(dead=True) if not retry else sub.retry.outcome(exc, self.delivery.attempts)
        self.settled = True
        return await self._batch.write_failure(self.delivery, exc, fate)

    async def release(self) -> bool:
        """Hand the delivery back to pending, in its place, without counting the attempt."""
        if self.settled:
            return False
        self.settled = True
        return await self._batch.store.release([self.delivery.id], self.delivery.lease_token) == 1

    async def extend(self, lease_seconds: float | None = None) -> bool:
        """Renew the lease for ``lease_seconds`` from now (default: the claim's); False if it is lost."""
        seconds = self._batch.lease_seconds if lease_seconds is None else _checked_lease(lease_seconds)
        if self.settled:
            return False
        renewed = await self._batch.store.extend([self.delivery.id], self.delivery.lease_token, seconds)
        return self.delivery.id in renewed


class Batch:
    """The deliveries of one claim, in claim order; iterate it or index it."""

    def __init__(
        self,
        store: DeliveryStore,
        subscription: Subscription,
        lease_seconds: float,
        worker_id: str,
        outgoing: Outgoing,
    ) -> None:
        self.store = store
        self.subscription = subscription
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id
        self._outgoing = outgoing
        self._started = time.monotonic()
        self.deliveries: list[PulledDelivery] = []

    def __iter__(self) -> Iterator[PulledDelivery]:
        return iter(self.deliveries)

    def __len__(self) -> int:
        return len(self.deliveries)

    def __getitem__(self, index: int) -> PulledDelivery:
        return self.deliveries[index]

    def follow_up(self, delivery: ClaimedDelivery, event: Event) -> OutgoingEvent:
        if not isinstance(event, Event):
            raise ConfigurationError(f"follow_ups are events, not {type(event).__name__}")
        return self._outgoing(
            event,
            correlation_id=delivery.correlation_id or delivery.event_id,
            causation_id=delivery.event_id,
        )

    async def write_failure(self, delivery: ClaimedDelivery, exc: BaseException, fate: Outcome) -> bool:
        failure = self.failure(delivery, exc, fate)
        return failure.lease in await self.store.fail([failure])

    def failure(self, delivery: ClaimedDelivery, exc: BaseException, fate: Outcome) -> Failure:
        """The record of one failed attempt of ``delivery`` under this batch's lease."""
        return Failure.of(
            delivery,
            exc,
            dead=fate.dead,
            retry_delay_seconds=fate.delay_seconds,
            duration_seconds=time.monotonic() - self._started,
            worker_id=self.worker_id,
            subscription=self.subscription.name,
        )

    async def release_unsettled(self) -> int:
        """Hand back every delivery not settled yet (one statement: they share the lease token)."""
        left = [d for d in self.deliveries if not d.settled]
        for d in left:
            d.settled = True
        if not left:
            return 0
        return await self.store.release([d.id for d in left], left[0].lease_token)


class Pull:
    """``bus.pull``: subscriptions without a handler, and the claims that take their deliveries."""

    def __init__(
        self,
        router: Router,
        store: Callable[[], DeliveryStore],
        register: Callable[[Sequence[str]], Awaitable[dict[str, int]]],
        outgoing: Outgoing,
        max_payload_bytes: Callable[[], int],
        show: Callable[[int], Awaitable[DeliveryDetail]],
    ) -> None:
        self._router = router
        self._show = show
        self._store = store
        """The backend's delivery store, looked up at each claim."""
        self._register = register
        self._outgoing = outgoing
        self._max_payload_bytes = max_payload_bytes
        self._ids: dict[str, int] = {}

    def subscription(
        self,
        event_class: type[Event],
        *,
        name: str,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        lease_seconds: float = 30.0,
        ordered: bool = False,
        start_from: Literal["earliest", "latest"] = "earliest",
    ) -> Subscription:
        """Declare a subscription of ``event_class`` that no worker serves: :meth:`claim` takes its work.

        Recorded in the database as any subscription (``bus.register``, a
        worker's start, or the first claim), so events fan out to it.

        :raises DuplicateSubscription: ``name`` is taken.
        """
        event_type_of(event_class)  # fail now if the class has no event_type
        check_upcasters(event_class)
        if not isinstance(name, str) or not name:
            raise ConfigurationError("a pulled subscription needs a name=")
        policy = policy_with(retry, max_attempts)
        sub = Subscription(
            name=name,
            event_class=event_class,
            handler=None,
            retry=policy,
            lease_seconds=_checked_lease(lease_seconds),
            ordered=ordered,
            start_from=start_from,
        )
        self._router.add(sub)
        return sub

    @asynccontextmanager
    async def claim(
        self, subscription: str | Subscription, *, limit: int = 10, lease_seconds: float | None = None
    ) -> AsyncIterator[Batch]:
        """Claim up to ``limit`` runnable deliveries of ``subscription`` under one lease.

        ``async with bus.pull.claim("reports", limit=10) as batch:`` yields a
        :class:`Batch` (possibly empty) of :class:`PulledDelivery`; settle each
        with ``complete``, ``fail`` or ``release``, and ``extend`` a lease that
        needs longer. Leaving the block, however it is left (an exception, a
        cancellation), releases what was not settled, the attempt not counted.
        A delivery whose payload no longer decodes is dead-lettered, as a
        worker would, and not yielded.

        :raises NotFound: no subscription of that name in this bus.
        :raises ConfigurationError: it has a handler (a worker serves it), or a bad limit or lease.
        """
        batch = await self.take(subscription, limit=limit, lease_seconds=lease_seconds)
        try:
            yield batch
        finally:
            with anyio.CancelScope(shield=True):
                await batch.release_unsettled()

    async def take(
        self, subscription: str | Subscription, *, limit: int = 10, lease_seconds: float | None = None
    ) -> Batch:
        """Claim as :meth:`claim` does, for a process that settles the deliveries later or elsewhere.

        Nothing releases what this returns: each delivery stays claimed until
        it is settled (by this process, or by any other that names it with its
        lease token through :meth:`held`) or its lease runs out and it is
        recovered as a crashed worker's would be (the attempt counted). The
        command line's ``eventbus claim`` is built on it.

        :raises NotFound: no subscription of that name in this bus.
        :raises ConfigurationError: it has a handler (a worker serves it), or a bad limit or lease.
        """
        sub = self._subscription(subscription)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM:
            raise ConfigurationError(f"limit must be an int between 1 and {MAX_CLAIM}, got {limit!r}")
        seconds = sub.lease_seconds if lease_seconds is None else _checked_lease(lease_seconds)
        sub_id = await self._subscription_id(sub.name)
        store = self._store()
        batch = Batch(store, sub, seconds, str(uuid.uuid4()), self._outgoing)
        claimed = await store.claim(sub_id, limit, seconds, batch.worker_id, sub.ordered)
        try:
            await self._decode_into(batch, claimed)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await batch.release_unsettled()
            raise
        return batch

    async def _decode_into(self, batch: Batch, claimed: Sequence[ClaimedDelivery]) -> None:
        """Add the decodable deliveries to ``batch``; dead-letter the others in one statement."""
        undecodable: list[Failure] = []
        for delivery in claimed:
            try:
                event = decode_claimed(batch.subscription, delivery, self._max_payload_bytes())
            except DecodeError as exc:
                undecodable.append(batch.failure(delivery, exc, Outcome(dead=True)))
                continue
            batch.deliveries.append(PulledDelivery(batch, delivery, event))
        if undecodable:  # dead-lettered, as a worker would
            await batch.store.fail(undecodable)

    async def held(self, delivery_id: int, lease_token: str) -> PulledDelivery:
        """The delivery ``delivery_id`` claimed under ``lease_token``, to settle or extend in any process.

        A script that claimed with ``eventbus claim`` (or :meth:`take`) hands
        the id and token to whatever finishes the work. Nothing is checked
        against the lease here: each method of the result is fenced by the
        token, as in the claiming process, and returns False once it no longer
        holds. The attempt number the retry policy counts is read with the
        delivery (from a replica when the bus reads from one, which may lag).

        :raises NotFound: no such delivery, or its subscription is not in this bus.
        :raises ConfigurationError: the token is not a lease token, or the subscription has a handler.
        """
        try:
            token = str(uuid.UUID(lease_token))
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"{lease_token!r} is not a lease token (a UUID)") from exc
        detail = await self._show(delivery_id)
        sub = self._subscription(detail.subscription)
        delivery = _claimed_of(detail, token)
        batch = Batch(self._store(), sub, sub.lease_seconds, str(uuid.uuid4()), self._outgoing)
        event = decode_claimed(sub, delivery, self._max_payload_bytes())
        pulled = PulledDelivery(batch, delivery, event)
        batch.deliveries.append(pulled)
        return pulled

    def _subscription(self, subscription: str | Subscription) -> Subscription:
        name = subscription.name if isinstance(subscription, Subscription) else subscription
        sub = self._router.subscriptions.get(name) if isinstance(name, str) else None
        if sub is None:
            raise NotFound(f"no subscription named {name!r} in this bus")
        if sub.handler is not None:
            raise ConfigurationError(
                f"subscription {name!r} has a handler that workers run; "
                "declare one with bus.pull.subscription(...) to claim its deliveries"
            )
        return sub

    async def _subscription_id(self, name: str) -> int:
        if name not in self._ids:
            self._ids.update(await self._register([name]))
        return self._ids[name]


def _claimed_of(detail: DeliveryDetail, lease_token: str) -> ClaimedDelivery:
    """A delivery read back by id, as its claim under ``lease_token`` handed it out."""
    return ClaimedDelivery(
        id=detail.id,
        event_id=detail.event_id,
        subscription_id=0,
        attempts=detail.attempts,
        lease_token=lease_token,
        event_type=detail.event_type,
        payload=detail.payload,
        headers=detail.headers,
        key=detail.key,
        correlation_id=detail.correlation_id,
        ordering_key=None,
        created_at=detail.created_at,
        run_at=detail.run_at,
        causation_id=detail.causation_id,
        event_version=detail.event_version,
        priority=detail.priority,
    )


def _checked_lease(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= 86400:
        raise ConfigurationError(f"lease_seconds must be a number of seconds in (0, 86400], got {seconds!r}")
    return float(seconds)
