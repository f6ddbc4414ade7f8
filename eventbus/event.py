"""Typed events: msgspec Structs with a stable ``event_type`` name.

Declare an event by subclassing :class:`Event` with the type name as a class
keyword::

    class OrderPlaced(Event, event_type="order.placed"):
        order_id: str
        amount_cents: int

The name, not the class name, is what is stored, so classes can be renamed and
moved freely. Evolve events the msgspec way: new fields get defaults, types
never change, and a new meaning gets a new ``event_type``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import msgspec

from .errors import ConfigurationError, DecodeError, EncodeError

__all__ = ["Event", "EventT", "check_event_type", "decode_event", "encode_event", "event_type_of"]

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_options: object) -> Any:
        return lambda cls: cls


_EVENT_TYPE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}$")


def check_event_type(event_type: str) -> str:
    """Return ``event_type`` if it is a valid name (letters, digits and . _ : -), else raise."""
    if not _EVENT_TYPE_RE.match(event_type):
        raise ConfigurationError(
            f"invalid event_type {event_type!r}: use letters, digits and . _ : - (at most 200)"
        )
    return event_type


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(msgspec.field,))
class _EventMeta(msgspec.StructMeta):
    """Struct metaclass that accepts the ``event_type`` class keyword."""

    def __new__(
        mcls,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        event_type: str | None = None,
        **kwargs: Any,
    ) -> Any:
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        if event_type is not None:
            cls.__event_type__ = check_event_type(event_type)  # type: ignore[attr-defined]
        return cls


class Event(msgspec.Struct, metaclass=_EventMeta, frozen=True, kw_only=True):
    """Base class of every event. Subclasses pass ``event_type="…"``."""

    __event_type__: ClassVar[str] = ""


EventT = TypeVar("EventT", bound=Event)
"""Any subclass of :class:`Event`."""

_encoder = msgspec.json.Encoder()
_decoders: dict[type[Event], msgspec.json.Decoder[Any]] = {}


def event_type_of(cls: type[Event]) -> str:
    """Return the stable type name of an event class."""
    name = getattr(cls, "__event_type__", "")
    if not name:
        raise ConfigurationError(
            f"{cls.__qualname__} has no event_type: declare it as "
            f'`class {cls.__name__}(Event, event_type="...")`'
        )
    return str(name)


def encode_event(event: Event) -> bytes:
    """Encode an event to JSON bytes."""
    try:
        return _encoder.encode(event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"cannot encode {type(event).__qualname__}: {exc}") from exc


def decoder_for(cls: type[EventT]) -> msgspec.json.Decoder[EventT]:
    """Return the cached JSON decoder of an event class."""
    decoder = _decoders.get(cls)
    if decoder is None:
        decoder = _decoders[cls] = msgspec.json.Decoder(cls)
    return decoder


def decode_event(cls: type[EventT], payload: bytes) -> EventT:
    """Decode JSON bytes to an event, raising :class:`DecodeError` on any mismatch."""
    try:
        return decoder_for(cls).decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DecodeError(f"payload does not decode as {event_type_of(cls)}: {exc}") from exc
