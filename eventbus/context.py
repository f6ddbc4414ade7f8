"""What a handler gets beside its event."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from .backends.base import ClaimedDelivery, OutgoingEvent
from .event import Event
from .types import DeliveryId, EventId

__all__ = ["Context"]


class Context:
    """Envelope data of the delivery being handled, and :meth:`emit` for follow-ups."""

    __slots__ = ("_build", "_delivery", "follow_ups", "subscription")

    def __init__(
        self,
        delivery: ClaimedDelivery,
        subscription: str,
        build: Callable[..., OutgoingEvent],
    ) -> None:
        self._delivery = delivery
        self._build = build
        self.subscription = subscription
        self.follow_ups: list[OutgoingEvent] = []

    @property
    def event_id(self) -> EventId:
        return self._delivery.event_id

    @property
    def event_type(self) -> str:
        return self._delivery.event_type

    @property
    def causation_id(self) -> EventId | None:
        """The event whose handler emitted this one (None for an event published directly)."""
        cause = self._delivery.causation_id
        return None if cause is None else EventId(cause)

    @property
    def delivery_id(self) -> DeliveryId:
        return self._delivery.id

    @property
    def lease_token(self) -> str:
        """The lease this delivery is held under; writes fenced by it fail once it is lost."""
        return self._delivery.lease_token

    @property
    def attempt(self) -> int:
        """1 on the first run of this delivery."""
        return self._delivery.attempts

    @property
    def key(self) -> str | None:
        return self._delivery.key

    @property
    def headers(self) -> dict[str, str]:
        return self._delivery.headers

    @property
    def correlation_id(self) -> EventId:
        """The root event of this chain (this event itself when it is the root)."""
        return EventId(self._delivery.correlation_id or self._delivery.event_id)

    @property
    def created_at(self) -> datetime:
        return self._delivery.created_at

    def emit(
        self,
        event: Event,
        *,
        key: str | None = None,
        delay: float | timedelta | None = None,
        headers: dict[str, str] | None = None,
        ordering_key: str | None = None,
    ) -> None:
        """Publish ``event`` atomically with this delivery's completion.

        Nothing is written if the handler fails or the completion does not
        commit; with a ``key``, a re-run after a crash cannot duplicate it.
        The event is checked here, as :meth:`Bus.publish` checks it: a bad key
        (:class:`InvalidKey`), headers (:class:`EncodeError`) or size
        (:class:`PayloadTooLarge`) raises in the handler.
        """
        self.follow_ups.append(
            self._build(
                event,
                key=key,
                delay=delay,
                headers=headers,
                ordering_key=ordering_key,
                correlation_id=self.correlation_id,
                causation_id=self.event_id,
            )
        )
