"""Subscriptions and handler groups declared without a bus."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .context import Context
from .errors import DecodeError, DuplicateSubscription, HandlerSignatureError, InvalidSchedule
from .event import Event, check_upcasters, decode_event, event_type_of
from .fanout import LEASE_SECONDS as FAN_OUT_LEASE_SECONDS
from .fanout import RETRY as FAN_OUT_RETRY
from .fanout import FanOutTarget, per_tenant_of
from .retry import RetryPolicy, policy_with
from .schedules import EPOCH, EventTarget, MachineTarget, Schedule
from .types import DstFold, DstGap, MissedPolicy, OverlapPolicy

if TYPE_CHECKING:
    from .backends.base import ClaimedDelivery

__all__ = ["TRANSACTIONAL_TIMEOUT_SECONDS", "Handler", "Router", "Subscription"]

Handler = Callable[[Any, Context], Awaitable[None]]
"""What a subscription calls: ``async def handler(event, ctx) -> None``."""
H = TypeVar("H", bound=Handler)

TRANSACTIONAL_TIMEOUT_SECONDS = 10.0
"""The timeout of a transactional handler that names none: how long its transaction stays open
(on SQLite, how long it holds the file's write lock)."""


@dataclass(frozen=True)
class Subscription:
    """A handler bound to one event type under a stable name.

    Without a handler (``bus.pull.subscription``) no worker serves it: code
    takes its deliveries with ``bus.pull.claim``.
    """

    name: str
    event_class: type[Event]
    handler: Handler | None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease_seconds: float = 30.0
    timeout_seconds: float | None = None
    ordered: bool = False
    start_from: Literal["earliest", "latest"] = "earliest"
    transactional: bool = False
    """The handler writes through ``ctx.connection``, in the transaction that completes the delivery."""

    @cached_property
    def event_type(self) -> str:
        return event_type_of(self.event_class)  # read for every delivery a worker runs


def _check_handler(handler: Callable[..., Any], event_class: type[Event]) -> None:
    name = getattr(handler, "__qualname__", repr(handler))
    if not inspect.iscoroutinefunction(handler):
        raise HandlerSignatureError(f"handler {name} must be an `async def` function")
    params = list(inspect.signature(handler).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != 2 or len(params) != 2:
        raise HandlerSignatureError(
            f"handler {name} must take exactly (event, ctx), got {len(params)} parameters"
        )
    try:
        hints = typing.get_type_hints(handler)
    except Exception as exc:
        raise HandlerSignatureError(f"cannot resolve annotations of {name}: {exc}") from exc
    annotated = hints.get(positional[0].name)
    if annotated is not None and annotated is not event_class:
        if not (isinstance(annotated, type) and issubclass(event_class, annotated)):
            raise HandlerSignatureError(
                f"handler {name} is annotated for {annotated!r} but subscribes to {event_class.__qualname__}"
            )


class Router:
    """A group of subscriptions and schedules, included into a bus with ``bus.include(router)``."""

    def __init__(self) -> None:
        self.subscriptions: dict[str, Subscription] = {}
        self.declared_schedules: dict[str, Schedule] = {}
        """The schedules declared here, by name (a bus records them through ``bus.schedules``)."""

    def subscribe(
        self,
        event_class: type[Event],
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        lease_seconds: float = 30.0,
        timeout_seconds: float | None = None,
        ordered: bool = False,
        start_from: Literal["earliest", "latest"] = "earliest",
        transactional: bool = False,
    ) -> Callable[[H], H]:
        """Register the decorated ``async def handler(event, ctx)``; return it unchanged.

        With ``transactional=True`` the handler gets ``ctx.connection``, inside the
        transaction that completes the delivery and writes its follow-ups and
        starts: its writes commit with the completion or not at all (see the
        delivery contract). Its timeout defaults to
        :data:`TRANSACTIONAL_TIMEOUT_SECONDS`.

        :raises InvalidUpcaster: the class's upcasters leave a gap before its version.
        """
        event_type_of(event_class)  # fail now if the class has no event_type
        check_upcasters(event_class)
        policy = policy_with(retry, max_attempts)
        if lease_seconds <= 0:
            raise HandlerSignatureError("lease_seconds must be positive")
        if transactional and timeout_seconds is None:
            timeout_seconds = TRANSACTIONAL_TIMEOUT_SECONDS

        def decorate(handler: H) -> H:
            _check_handler(handler, event_class)
            sub_name = name or f"{handler.__module__}.{handler.__qualname__}"
            self.add(
                Subscription(
                    name=sub_name,
                    event_class=event_class,
                    handler=handler,
                    retry=policy,
                    lease_seconds=lease_seconds,
                    timeout_seconds=timeout_seconds,
                    ordered=ordered,
                    start_from=start_from,
                    transactional=transactional,
                )
            )
            return handler

        return decorate

    def add(self, subscription: Subscription) -> None:
        """Add a subscription built by hand; :class:`DuplicateSubscription` if its name is taken."""
        if subscription.name in self.subscriptions:
            raise DuplicateSubscription(f"a subscription named {subscription.name!r} is already registered")
        self.subscriptions[subscription.name] = subscription

    def include(self, router: Router) -> None:
        """Add every subscription and schedule of ``router`` to this one."""
        for subscription in router.subscriptions.values():
            self.add(subscription)
        for schedule in router.declared_schedules.values():
            self.add_schedule(schedule)

    def schedule(
        self,
        name: str,
        event_class: type[Event] | None = None,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        tz: str = "UTC",
        anchor: datetime = EPOCH,
        missed: MissedPolicy = "latest",
        max_catchup: int = 100,
        overlap: OverlapPolicy = "allow",
        cooldown: timedelta | float | None = None,
        jitter: timedelta | float | None = None,
        dst_gap: DstGap = "shift",
        dst_fold: DstFold = "first",
        start: Any = None,
        checkpoint: Any = None,
        for_each: Any = None,
        spread: timedelta | float | None = None,
        priority: int = 0,
    ) -> Schedule:
        """Declare a recurring schedule that publishes ``event_class`` at each occurrence.

        Exactly one of ``cron`` (in ``tz``'s wall clock) and ``every`` (elapsed
        time from ``anchor``). Each firing publishes with the key
        ``name@<scheduled_for ISO-8601>`` and sets the event's ``scheduled_for``
        field when it has one. With ``start=machine`` and
        ``checkpoint=fn(scheduled_for)`` instead of an event class, each firing
        starts a run of that state machine. A worker records the declaration
        when it starts. Raises :class:`InvalidSchedule` for a bad spec or policy,
        :class:`~eventbus.errors.InvalidPriority` for a bad ``priority``.

        Each firing's events (for ``start=``, the machine's start event; with
        ``for_each``, the occurrence's fan-out event) are published with
        ``priority`` (0 to 9, lower first, as in ``publish``), and so are a
        fan-out's events per tenant.

        With ``for_each=list_tenants`` (a function, sync or async, returning
        tenant keys) each occurrence fans out: one event per tenant (the class
        has a ``tenant`` field), or with ``start=`` one run per tenant from
        ``checkpoint=fn(tenant, scheduled_for)``, all committed in one
        transaction and keyed ``name@<scheduled_for>/<tenant>``. ``spread``
        (seconds) delays each tenant by a fixed offset in the window, hashed
        from the tenant. See :mod:`eventbus.fanout`.
        """
        target = _target(name, event_class, start, checkpoint, for_each, spread, priority)
        schedule = Schedule.build(
            name, target, cron=cron, every=every, tz=tz, anchor=anchor, missed=missed,
            max_catchup=max_catchup, overlap=overlap, cooldown=cooldown, jitter=jitter,
            dst_gap=dst_gap, dst_fold=dst_fold, priority=priority,
        )  # fmt: skip
        if isinstance(target, FanOutTarget) and target.subscription in self.subscriptions:
            raise DuplicateSubscription(f"a subscription named {target.subscription!r} is already registered")
        self.add_schedule(schedule)
        if isinstance(target, FanOutTarget):
            fan_out = (target.subscription, target.event_class, target.fan_out)
            self.add(Subscription(*fan_out, FAN_OUT_RETRY, FAN_OUT_LEASE_SECONDS))
        return schedule

    def add_schedule(self, schedule: Schedule) -> None:
        """Add a schedule built by hand; :class:`InvalidSchedule` if its name is taken."""
        if schedule.name in self.declared_schedules:
            raise InvalidSchedule(f"a schedule named {schedule.name!r} is already declared")
        self.declared_schedules[schedule.name] = schedule


def _target(
    name: str,
    event_class: type[Event] | None,
    start: Any,
    checkpoint: Any,
    for_each: Any,
    spread: Any,
    priority: int,
) -> EventTarget | MachineTarget | FanOutTarget:
    """What a schedule fires, from the options of :meth:`Router.schedule`, checked."""
    if start is not None and (event_class is not None or checkpoint is None):
        raise InvalidSchedule(f"schedule {name!r}: start= takes checkpoint= and no event class")
    if start is None and (event_class is None or checkpoint is not None):
        raise InvalidSchedule(f"schedule {name!r}: name the event class it publishes, or start= a machine")
    if event_class is not None:
        event_type_of(event_class)  # fail now if the class has no event_type
    if for_each is not None:
        seconds = spread.total_seconds() if isinstance(spread, timedelta) else spread or 0.0
        per_tenant = per_tenant_of(event_class, start, checkpoint)
        return FanOutTarget.build(name, per_tenant, for_each, seconds, priority)
    if spread is not None:
        raise InvalidSchedule(f"schedule {name!r}: spread= spreads a fan-out (for_each=) only")
    target = MachineTarget(start, checkpoint) if start is not None else EventTarget(event_class)  # type: ignore[arg-type]
    target.check()
    return target


def decode_claimed(sub: Subscription, delivery: ClaimedDelivery, max_payload_bytes: int) -> Event:
    """A claimed delivery's event as ``sub``'s class (older versions upcast), for a handler or a pull.

    :raises DecodeError: the event is of another type, over ``max_payload_bytes``, or undecodable.
    """
    if delivery.event_type != sub.event_type:
        raise DecodeError(
            f"event type {delivery.event_type!r} is not {sub.event_type!r}, "
            f"the type subscription {sub.name!r} handles"
        )
    if len(delivery.payload) > max_payload_bytes:
        raise DecodeError(
            f"payload of {len(delivery.payload)} bytes is over the limit of {max_payload_bytes}"
        )
    return decode_event(sub.event_class, delivery.payload, delivery.event_version)
