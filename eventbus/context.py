"""What a handler gets beside its event."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from .backends.base import ClaimedDelivery, OutgoingEvent, WorkflowStart
from .errors import ConfigurationError
from .event import Event
from .types import DeliveryId, EventId

__all__ = ["Context"]


class Context:
    """Envelope data of the delivery being handled, :meth:`emit` for follow-ups and
    :meth:`start` for runs of state machines, both written with the delivery's completion."""

    __slots__ = ("_build", "_connection", "_delivery", "_prepare", "follow_ups", "starts", "subscription")

    def __init__(
        self,
        delivery: ClaimedDelivery,
        subscription: str,
        build: Callable[..., OutgoingEvent],
        prepare: Callable[..., WorkflowStart] | None = None,
        connection: Any = None,
    ) -> None:
        self._delivery = delivery
        self._connection = connection
        self._build = build
        self._prepare = prepare
        self.subscription = subscription
        self.follow_ups: list[OutgoingEvent] = []
        self.starts: list[WorkflowStart] = []

    @property
    def connection(self) -> Any:
        """The database connection of a transactional handler (``subscribe(..., transactional=True)``).

        On PostgreSQL an asyncpg connection, on SQLite an aiosqlite connection,
        inside the transaction that will also complete this delivery and write
        what :meth:`emit` and :meth:`start` add: what the handler writes through
        it commits with the completion, or not at all. Do not commit, roll back
        or close it. :class:`ConfigurationError` for a handler that is not transactional.
        """
        if self._connection is None:
            raise ConfigurationError(
                f"subscription {self.subscription!r} is not transactional: ctx.connection is given "
                "only to handlers subscribed with transactional=True"
            )
        return self._connection

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
    def priority(self) -> int:
        """The priority the event was published with (0 to 9, lower first)."""
        return self._delivery.priority

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
        once: bool = False,
        priority: int = 0,
    ) -> None:
        """Publish ``event`` atomically with this delivery's completion.

        Nothing is written if the handler fails or the completion does not
        commit; with a ``key``, a re-run after a crash cannot duplicate it
        (and with ``once=True`` the key is kept for good, as
        ``bus.publish(..., once=True)`` keeps it).
        The event is checked here, as :meth:`Bus.publish` checks it: a bad key
        (:class:`InvalidKey`), headers (:class:`EncodeError`) or size
        (:class:`PayloadTooLarge`) raises in the handler, and so does a
        priority outside 0 to 9 (:class:`~eventbus.errors.InvalidPriority`).
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
                once=once,
                priority=priority,
            )
        )

    def start(self, machine: Any, checkpoint: Any, *, once: bool = False, priority: int = 0) -> None:
        """Start a run of ``machine`` (a :class:`~eventbus.workflows.Machine` included in
        the bus, or its name) atomically with this delivery's completion.

        Written as :meth:`emit`'s follow-ups are: nothing is started if the
        handler fails or the completion is refused (a lost lease), and a handler
        run again after a crash starts nothing twice. Applied as
        ``bus.workflows.start(machine, checkpoint, once=once)`` applies it: a
        live run of the key is left alone, and with ``once`` a completed one too.
        ``priority`` is the run's, for every step of it, as in ``bus.workflows.start``.
        The checkpoint is checked here: a wrong type or key raises
        :class:`ConfigurationError` (:class:`UnknownMachine` for a machine the
        bus does not include) in the handler.
        """
        if self._prepare is None:
            raise ConfigurationError("this context cannot start runs: it belongs to no bus")
        self.starts.append(self._prepare(machine, checkpoint, once=once, priority=priority))
