"""Hooks: where logs, metrics and traces see what the bus and its workers do.

A :class:`Hooks` object is told about each publish, each claimed batch, each
handler run and each delivery outcome. :class:`NoHooks` does nothing and is
the base to extend; :class:`CompositeHooks` calls several in order. Hooks are
called on the hot path: they must be cheap and must not raise (an exception
from a hook is logged and ignored, never allowed to lose a result).

The worker keeps what hooks need about a delivery from its claim to its
outcome in a :class:`DeliveryTracker`, so each hook gets one
:class:`DeliveryOutcome` with the ids, timings and result instead of piecing them
together. When no hook observes deliveries (the default: only the outcome
log is attached, and its completion level is off), the worker tracks
nothing per delivery; a hook added with ``bus.add_hooks`` to a running
worker is told from the worker's next claim on. While a handler runs,
:data:`current_delivery` holds its :class:`DeliveryContext` either way;
:mod:`eventbus.logs` copies it into every log record the handler writes.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .backends.base import ClaimedDelivery, Completion, Failure, LeaseKey, OutgoingEvent, Rescue
from .types import DeliveryId, PublishResult

if TYPE_CHECKING:
    from .context import Context

__all__ = [
    "CompositeHooks",
    "DeliveryContext",
    "DeliveryOutcome",
    "DeliveryTracker",
    "Hooks",
    "NoHooks",
    "OutcomeKind",
    "PublishDone",
    "Publishing",
    "current_delivery",
    "delivery_context",
    "observes_deliveries",
    "wants_every_outcome",
]

log = logging.getLogger("eventbus.observe")

OutcomeKind = Literal["completed", "retry", "dead", "refused"]
"""How a delivery's attempt ended: ``refused`` means the database rejected the
result because this worker no longer held the lease."""

PublishDone = Callable[[Sequence[PublishResult] | None, BaseException | None], None]
"""Called once a publish returned (results) or raised (the error)."""
Publishing = tuple[Sequence[OutgoingEvent], PublishDone | None]
"""What :meth:`Hooks.on_publish` returns: the events to publish, and a callback or None."""


@dataclass(frozen=True, slots=True)
class DeliveryContext:
    """The ids of the delivery a handler is running (see :func:`delivery_context`)."""

    event_id: int
    event_type: str
    delivery_id: int
    subscription: str
    attempt: int
    worker_id: str
    correlation_id: int
    causation_id: int | None

    def fields(self) -> dict[str, object]:
        """The ids as a dict, for log records and structured loggers."""
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "delivery_id": self.delivery_id,
            "subscription": self.subscription,
            "attempt": self.attempt,
            "worker_id": self.worker_id,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
        }


current_delivery: contextvars.ContextVar[tuple[Context, str] | None] = contextvars.ContextVar(
    "eventbus_current_delivery", default=None
)
"""(handler context, worker id) while a handler runs in this task; read it with :func:`delivery_context`."""


def delivery_context() -> DeliveryContext | None:
    """The ids of the delivery whose handler is running in this task, or None."""
    bound = current_delivery.get()
    if bound is None:
        return None
    ctx, worker_id = bound
    return DeliveryContext(
        event_id=ctx.event_id,
        event_type=ctx.event_type,
        delivery_id=ctx.delivery_id,
        subscription=ctx.subscription,
        attempt=ctx.attempt,
        worker_id=worker_id,
        correlation_id=ctx.correlation_id,
        causation_id=ctx.causation_id,
    )


@dataclass(slots=True)
class DeliveryOutcome:
    """One attempt of one delivery, as it ended."""

    kind: OutcomeKind
    subscription: str
    delivery: ClaimedDelivery
    worker_id: str
    result: Completion | Failure
    duration_seconds: float | None
    """Handler time (decode included); None when no handler ran."""
    wait_seconds: float | None
    """From when the delivery became runnable to its claim."""
    claimed_at: float = 0.0
    """``time.monotonic()`` at the claim."""


class Hooks(Protocol):
    """What the bus and its workers report. Every method must be cheap and not raise."""

    def on_publish(self, events: Sequence[OutgoingEvent]) -> Publishing:
        """Before a publish: may return the events changed (headers added) and a callback for its end."""
        ...

    def on_outgoing(self, event: OutgoingEvent) -> OutgoingEvent:
        """An event built for later publication (a handler's follow-up): may return it changed."""
        ...

    def on_claim(self, subscription: str, batch: Sequence[ClaimedDelivery], seconds: float) -> None:
        """A claim round trip returned ``batch`` (possibly empty) after ``seconds``."""
        ...

    def handling(self, ctx: Context) -> contextlib.AbstractContextManager[object]:
        """Entered around the handler call, in the handler's task."""
        ...

    def on_outcome(self, outcome: DeliveryOutcome) -> None:
        """A result was written (or refused) for one delivery."""
        ...


_NULL = contextlib.nullcontext()


class NoHooks:
    """Hooks that do nothing: subclass and override what you need."""

    def on_publish(self, events: Sequence[OutgoingEvent]) -> Publishing:
        return events, None

    def on_outgoing(self, event: OutgoingEvent) -> OutgoingEvent:
        return event

    def on_claim(self, subscription: str, batch: Sequence[ClaimedDelivery], seconds: float) -> None:
        return None

    def handling(self, ctx: Context) -> contextlib.AbstractContextManager[object]:
        return _NULL

    def on_outcome(self, outcome: DeliveryOutcome) -> None:
        return None

    def on_rescue(self, rescues: Sequence[Rescue]) -> None:
        """This process's worker took back the deliveries of lost workers (an optional hook:
        hooks that do not define it are not told)."""
        return None


class CompositeHooks(NoHooks):
    """Several hooks called in order; a hook that raises is logged and skipped."""

    def __init__(self, hooks: Sequence[Hooks] = ()) -> None:
        self.hooks: list[Hooks] = list(hooks)

    def add(self, hooks: Hooks) -> None:
        """Tell ``hooks`` too, after the others."""
        self.hooks.append(hooks)

    def wants_every_outcome(self) -> bool:
        return any(wants_every_outcome(h) for h in self.hooks)

    def on_publish(self, events: Sequence[OutgoingEvent]) -> Publishing:
        done: list[PublishDone] = []
        for h in self.hooks:
            try:
                events, finish = h.on_publish(events)
            except Exception:
                log.exception("hook %r failed in on_publish", h)
                continue
            if finish is not None:
                done.append(finish)
        if not done:
            return events, None
        return events, lambda results, error: self._finish(done, results, error)

    def _finish(
        self, done: list[PublishDone], results: Sequence[PublishResult] | None, error: BaseException | None
    ) -> None:
        for finish in done:
            try:
                finish(results, error)
            except Exception:
                log.exception("hook failed when a publish ended")

    def on_outgoing(self, event: OutgoingEvent) -> OutgoingEvent:
        for h in self.hooks:
            try:
                event = h.on_outgoing(event)
            except Exception:
                log.exception("hook %r failed in on_outgoing", h)
        return event

    def on_claim(self, subscription: str, batch: Sequence[ClaimedDelivery], seconds: float) -> None:
        for h in self.hooks:
            try:
                h.on_claim(subscription, batch, seconds)
            except Exception:
                log.exception("hook %r failed in on_claim", h)

    @contextlib.contextmanager
    def _handling_all(self, ctx: Context) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for h in self.hooks:
                try:
                    stack.enter_context(h.handling(ctx))
                except Exception:
                    log.exception("hook %r failed entering handling", h)
            yield

    def handling(self, ctx: Context) -> contextlib.AbstractContextManager[object]:
        if not self.hooks:
            return _NULL
        if len(self.hooks) == 1:
            return self.hooks[0].handling(ctx)
        return self._handling_all(ctx)

    def on_outcome(self, outcome: DeliveryOutcome) -> None:
        for h in self.hooks:
            try:
                h.on_outcome(outcome)
            except Exception:
                log.exception("hook %r failed in on_outcome", h)

    def on_rescue(self, rescues: Sequence[Rescue]) -> None:
        for h in self.hooks:
            told = getattr(h, "on_rescue", None)
            if told is None:
                continue
            try:
                told(rescues)
            except Exception:
                log.exception("hook %r failed in on_rescue", h)


@dataclass(slots=True)
class _Batch:
    """What is shared by the deliveries of one claim."""

    subscription: str
    claimed_at: float
    claimed_wall: datetime
    detailed: bool
    """Some hook wants every outcome (else only failures and refusals are reported)."""


def _wait_seconds(delivery: ClaimedDelivery, claimed: datetime) -> float | None:
    runnable = delivery.run_at or (delivery.created_at if delivery.attempts <= 1 else None)
    if runnable is None:
        return None
    return max(0.0, (claimed - runnable).total_seconds())


def observes_deliveries(hooks: object) -> bool:
    """Whether ``hooks`` do anything with a claimed delivery (its claim, handler run or outcome).

    A hook may say no with ``observes_deliveries()`` (the outcome log does while
    its completion level is off); hooks that do not say are taken to observe.
    """
    if isinstance(hooks, CompositeHooks):
        return any(observes_deliveries(h) for h in hooks.hooks)
    ask = getattr(hooks, "observes_deliveries", None)
    return True if ask is None else bool(ask())


def wants_every_outcome(hooks: object) -> bool:
    """Whether ``hooks`` use completions too (a hook may say no with ``wants_every_outcome()``)."""
    ask = getattr(hooks, "wants_every_outcome", None)
    return True if ask is None else bool(ask())


@dataclass
class DeliveryTracker:
    """What the worker knows of each delivery between its claim and its outcome.

    It binds :data:`current_delivery` around each handler (for
    :func:`delivery_context` and the log filter) and, when some hook wants
    every outcome, times the handler. When no hook observes deliveries (none
    but the outcome log, whose completion level is off: see
    :func:`observes_deliveries`, asked once per claimed batch), a batch is
    not tracked at all: its deliveries cost the context variable and nothing
    else. A delivery handed back unstarted, or whose result is never
    written, is dropped once more than ``limit`` are tracked.
    """

    hooks: CompositeHooks | NoHooks
    worker_id: str
    limit: int = 100_000
    _tracked: dict[int, tuple[_Batch, ClaimedDelivery]] = field(default_factory=dict)
    _durations: dict[int, float] = field(default_factory=dict)

    def claimed(self, subscription: str, batch: Sequence[ClaimedDelivery], seconds: float) -> None:
        if not observes_deliveries(self.hooks):
            return  # nothing would be told: the batch is not tracked
        info = _Batch(subscription, time.monotonic(), datetime.now(UTC), wants_every_outcome(self.hooks))
        tracked = self._tracked
        tracked.update({d.id: (info, d) for d in batch})
        while len(tracked) > self.limit:
            del tracked[next(iter(tracked))]
        self.hooks.on_claim(subscription, batch, seconds)

    def enter(self, ctx: Context) -> tuple[contextvars.Token[tuple[Context, str] | None], Any, float]:
        """Before the handler: bind the delivery, enter the hooks' context, start the clock."""
        token = current_delivery.set((ctx, self.worker_id))
        if not self._tracked:
            return token, None, 0.0
        tracked = self._tracked.get(ctx.delivery_id)
        if tracked is None or not tracked[0].detailed:
            return token, None, 0.0
        inner = self.hooks.handling(ctx)
        inner.__enter__()
        return token, inner, time.monotonic()

    def exit(self, ctx: Context, entered: tuple[Any, Any, float], exc: BaseException | None) -> None:
        """After the handler (``exc`` if it raised): the reverse of :meth:`enter`."""
        token, inner, started = entered
        try:
            if inner is not None:
                self._durations[ctx.delivery_id] = time.monotonic() - started
                if exc is None:
                    inner.__exit__(None, None, None)
                else:
                    inner.__exit__(type(exc), exc, exc.__traceback__)
        finally:
            current_delivery.reset(token)

    def written(self, results: Sequence[Completion | Failure], accepted: Collection[LeaseKey]) -> None:
        """Results the database accepted (their (delivery, token) in ``accepted``) or refused."""
        tracked, durations = self._tracked, self._durations
        if not tracked and not durations:
            return  # only tracked deliveries are reported
        for result in results:
            entry = tracked.pop(result.delivery_id, None)
            duration = durations.pop(result.delivery_id, None) if durations else None
            if entry is None:
                continue
            info, delivery = entry
            if (result.delivery_id, result.lease_token) not in accepted:
                kind: OutcomeKind = "refused"
            elif isinstance(result, Completion):
                if not info.detailed:
                    continue
                kind = "completed"
            else:
                kind = "dead" if result.dead else "retry"
            if duration is None and isinstance(result, Failure) and result.error_type != "DecodeError":
                duration = result.duration_seconds
            self.hooks.on_outcome(
                DeliveryOutcome(
                    kind=kind,
                    subscription=info.subscription,
                    delivery=delivery,
                    worker_id=self.worker_id,
                    result=result,
                    duration_seconds=duration,
                    wait_seconds=_wait_seconds(delivery, info.claimed_wall),
                    claimed_at=info.claimed_at,
                )
            )

    def forget(self, ids: Sequence[DeliveryId]) -> None:
        """Deliveries handed back without a result."""
        if not self._tracked and not self._durations:
            return
        for delivery_id in ids:
            self._tracked.pop(delivery_id, None)
            self._durations.pop(delivery_id, None)
