"""Subscriptions and handler groups declared without a bus."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .context import Context
from .errors import DuplicateSubscription, HandlerSignatureError
from .event import Event, event_type_of
from .retry import RetryPolicy

__all__ = ["Handler", "Router", "Subscription"]

Handler = Callable[[Any, Context], Awaitable[None]]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True)
class Subscription:
    """A handler bound to one event type under a stable name."""

    name: str
    event_class: type[Event]
    handler: Handler
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease_seconds: float = 30.0
    timeout_seconds: float | None = None
    ordered: bool = False
    start_from: Literal["earliest", "latest"] = "earliest"

    @property
    def event_type(self) -> str:
        return event_type_of(self.event_class)


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
    """A group of subscriptions, included into a bus with ``bus.include(router)``."""

    def __init__(self) -> None:
        self.subscriptions: dict[str, Subscription] = {}

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
    ) -> Callable[[H], H]:
        """Register the decorated ``async def handler(event, ctx)``; return it unchanged."""
        event_type_of(event_class)  # fail now if the class has no event_type
        policy = retry or RetryPolicy()
        if max_attempts is not None:
            policy = RetryPolicy(
                max_attempts=max_attempts,
                base_delay_seconds=policy.base_delay_seconds,
                max_delay_seconds=policy.max_delay_seconds,
                jitter=policy.jitter,
                non_retryable=policy.non_retryable,
            )
        if lease_seconds <= 0:
            raise HandlerSignatureError("lease_seconds must be positive")

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
                )
            )
            return handler

        return decorate

    def add(self, subscription: Subscription) -> None:
        if subscription.name in self.subscriptions:
            raise DuplicateSubscription(f"a subscription named {subscription.name!r} is already registered")
        self.subscriptions[subscription.name] = subscription

    def include(self, router: Router) -> None:
        """Add every subscription of ``router`` to this one."""
        for subscription in router.subscriptions.values():
            self.add(subscription)
