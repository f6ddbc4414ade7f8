"""Fan-out schedules: one occurrence starts a machine, or publishes an event, per tenant.

``bus.schedule(..., for_each=list_tenants)``: each occurrence fires one
internal fan-out event (keyed by the occurrence, in the tick's transaction,
as any firing). Its subscription, ``schedule.<name>``, lists the tenants
with the user's function (sync or async) and publishes one event (or machine
start event) per tenant *with its own completion*: every tenant's work is
committed in that one transaction, or none is. Each is keyed
``<name>@<scheduled_for>/<tenant>``, so an occurrence whose fan-out runs
again (a crash after the commit, a replay from the dead letters) starts
nothing twice.

The lister runs in a handler, not in the tick: it is user code that may be
slow, asynchronous or failing, and the tick's transaction holds the schedule
rows locked. A lister that raises is a :class:`~eventbus.errors.FanOutError`,
retried with backoff; one that returns something other than distinct tenant
keys is :class:`~eventbus.errors.InvalidSchedule`, dead at once (fix it and
replay the dead letter). Either way nothing of that occurrence was started.

``spread=`` delays each tenant's start by an offset in ``[0, spread)`` taken
from a hash of the schedule and the tenant: the same offset at every
occurrence (a steady rolling cadence per tenant), and 10,000 tenants are not
started in the same second.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread

from .backends.base import OutgoingEvent
from .errors import FanOutError, HandlerSignal, InvalidSchedule
from .event import Event, check_event_type
from .retry import RetryPolicy
from .schedules import EPOCH, EventTarget, MachineTarget, occurrence_key

if TYPE_CHECKING:
    from .context import Context

__all__ = [
    "LEASE_SECONDS",
    "MAX_TENANTS",
    "RETRY",
    "FanOutEvent",
    "FanOutTarget",
    "check_tenants",
    "spread_offset",
    "tenant_key",
]

MAX_TENANTS = 100_000
"""The most tenants one occurrence fans out to (they commit in one transaction)."""

RETRY = RetryPolicy(
    max_attempts=10, base_delay_seconds=5.0, max_delay_seconds=300.0, non_retryable=(InvalidSchedule,)
)
"""The fan-out's retries: a lister that raises is tried again; bad tenants are dead at once."""

LEASE_SECONDS = 120.0
"""The fan-out delivery's lease: room for a slow lister and a large commit (it is renewed meanwhile)."""

Lister = Callable[[], Iterable[str] | Awaitable[Iterable[str]]]


class FanOutEvent(Event, frozen=True):
    """The internal event one occurrence of a fan-out schedule fires."""

    scheduled_for: datetime


def _event_class(schedule: str) -> type[FanOutEvent]:
    event_type = f"schedule.{schedule}"
    try:
        check_event_type(event_type)
    except Exception as exc:
        raise InvalidSchedule(
            f"schedule {schedule!r}: a fan-out schedule's name uses letters, digits and . _ : - only"
        ) from exc
    meta: Any = type(FanOutEvent)
    namespace = {"__module__": __name__, "__qualname__": f"FanOutEvent[{event_type}]"}
    return meta("FanOutEvent", (FanOutEvent,), namespace, event_type=event_type, frozen=True)  # type: ignore[no-any-return]


def tenant_key(schedule: str, scheduled_for: datetime, tenant: str) -> str:
    """The idempotency key of one tenant's work at one occurrence."""
    return f"{occurrence_key(schedule, scheduled_for)}/{tenant}"


def spread_offset(schedule: str, tenant: str, spread_seconds: float) -> float:
    """Seconds in ``[0, spread_seconds)`` for ``tenant``: the same at every occurrence."""
    if not spread_seconds:
        return 0.0
    digest = hashlib.sha256(f"{schedule}/{tenant}".encode()).digest()
    return spread_seconds * int.from_bytes(digest[:8], "big") / 2.0**64


def check_tenants(schedule: str, found: Any) -> list[str]:
    """The lister's result as a list of distinct tenant keys, or :class:`InvalidSchedule`."""
    if isinstance(found, str | bytes) or not isinstance(found, Iterable):
        raise InvalidSchedule(
            f"schedule {schedule!r}: for_each must return tenant keys (an iterable of str), "
            f"not {type(found).__name__}"
        )
    tenants = list(found)
    if len(tenants) > MAX_TENANTS:
        raise InvalidSchedule(f"schedule {schedule!r}: for_each returned over {MAX_TENANTS} tenants")
    for tenant in tenants:
        if not isinstance(tenant, str) or not tenant or len(tenant) > 200 or "\x00" in tenant:
            raise InvalidSchedule(
                f"schedule {schedule!r}: for_each returned {tenant!r}; a tenant is a non-empty str "
                "of at most 200 characters without NUL"
            )
    if len(set(tenants)) != len(tenants):
        twice = sorted({t for t in tenants if tenants.count(t) > 1})[:3]
        raise InvalidSchedule(f"schedule {schedule!r}: for_each returned tenants twice: {twice}")
    return tenants


@dataclass(frozen=True)
class EventPerTenant:
    """Publish ``event_class(tenant=…)`` per tenant (``scheduled_for`` set when the class has it)."""

    event_class: type[Event]

    def event(self, tenant: str, scheduled_for: datetime) -> Event:
        fields = self.event_class.__struct_fields__
        args: dict[str, Any] = {"tenant": tenant}
        if "scheduled_for" in fields:
            args["scheduled_for"] = scheduled_for
        return self.event_class(**args)

    def check(self) -> None:
        if "tenant" not in self.event_class.__struct_fields__:
            raise InvalidSchedule(
                f"{self.event_class.__qualname__} needs a `tenant: str` field to be published per tenant"
            )
        try:
            self.event("sample", EPOCH)
        except TypeError as exc:
            raise InvalidSchedule(
                f"{self.event_class.__qualname__} cannot be built per tenant: every field but tenant "
                f"and scheduled_for needs a default ({exc})"
            ) from exc


@dataclass(frozen=True)
class StartPerTenant:
    """Start ``machine`` with ``checkpoint(tenant, scheduled_for)`` per tenant (its start event)."""

    machine: Any
    checkpoint: Callable[[str, datetime], Any]

    def event(self, tenant: str, scheduled_for: datetime) -> Event:
        data: bytes = self.machine.encode(self.checkpoint(tenant, scheduled_for))
        start: Event = self.machine.start_class(checkpoint=data.decode())
        return start

    def check(self) -> None:
        MachineTarget(self.machine, lambda when: self.checkpoint("sample", when)).check()


PerTenant = EventPerTenant | StartPerTenant


@dataclass(frozen=True)
class FanOutTarget:
    """What a fan-out schedule fires: one :class:`FanOutEvent`, fanned out by its subscription."""

    schedule: str
    per_tenant: PerTenant
    for_each: Lister
    spread_seconds: float
    event_class: type[FanOutEvent]
    priority: int = 0
    """The schedule's priority, given to each tenant's event as to the occurrence's."""

    @classmethod
    def build(
        cls, schedule: str, per_tenant: PerTenant, for_each: Any, spread: float, priority: int = 0
    ) -> FanOutTarget:
        """Check the parts of a fan-out schedule; raises :class:`InvalidSchedule`."""
        if not callable(for_each):
            raise InvalidSchedule(f"schedule {schedule!r}: for_each= takes a function listing the tenants")
        if isinstance(spread, bool) or not isinstance(spread, int | float) or not 0 <= spread < math.inf:
            raise InvalidSchedule(f"schedule {schedule!r}: spread= is a finite number of seconds, 0 or more")
        per_tenant.check()
        return cls(schedule, per_tenant, for_each, spread, _event_class(schedule), priority)

    @property
    def kind(self) -> Literal["event", "machine"]:
        return "machine" if isinstance(self.per_tenant, StartPerTenant) else "event"

    @property
    def name(self) -> str:
        if isinstance(self.per_tenant, StartPerTenant):
            return str(self.per_tenant.machine.name)
        return EventTarget(self.per_tenant.event_class).name

    @property
    def subscription(self) -> str:
        """The name of the subscription that fans each occurrence out."""
        return f"schedule.{self.schedule}"

    def work(self, schedule: str, scheduled_for: datetime, delay_seconds: float) -> OutgoingEvent:
        return EventTarget(self.event_class).work(schedule, scheduled_for, delay_seconds)

    async def tenants(self) -> list[str]:
        """The lister's tenants, checked; a lister that raises is a :class:`FanOutError`."""
        try:
            if inspect.iscoroutinefunction(self.for_each):
                found: Any = await self.for_each()
            else:
                found = await anyio.to_thread.run_sync(self.for_each)
                if inspect.isawaitable(found):
                    found = await found
        except HandlerSignal:
            raise  # Retry / DeadLetter steer the fan-out as they steer any handler
        except Exception as exc:
            raise FanOutError(f"schedule {self.schedule!r}: for_each raised {exc!r}") from exc
        return check_tenants(self.schedule, found)

    async def fan_out(self, event: FanOutEvent, ctx: Context) -> None:
        """The handler of the fan-out event: one keyed event per tenant, with this completion."""
        when = event.scheduled_for
        for tenant in await self.tenants():
            ctx.emit(
                self.per_tenant.event(tenant, when),
                key=tenant_key(self.schedule, when, tenant),
                delay=spread_offset(self.schedule, tenant, self.spread_seconds),
                priority=self.priority,
            )


def per_tenant_of(event_class: type[Event] | None, start: Any, checkpoint: Any) -> PerTenant:
    """What each tenant gets: ``event_class`` published, or ``start`` with ``checkpoint(tenant, when)``."""
    if start is not None:
        return StartPerTenant(start, checkpoint)
    assert event_class is not None
    return EventPerTenant(event_class)
