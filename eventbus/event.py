"""Typed events: msgspec Structs with a stable ``event_type`` name.

Declare an event by subclassing :class:`Event` with the type name as a class
keyword::

    class OrderPlaced(Event, event_type="order.placed"):
        order_id: str
        amount_cents: int

The name, not the class name, is what is stored, so classes can be renamed and
moved freely. Evolve events the msgspec way: new fields get defaults, types
never change, and a new meaning gets a new ``event_type``.

A change that old payloads cannot follow (a renamed or restructured field)
gets a new ``version``, and an upcaster from each older version: a function
from the stored payload as builtins (a dict) to the next version's::

    class OrderPlaced(Event, event_type="order.placed", version=2):
        order_id: str
        total_cents: int

    @OrderPlaced.upcast(1)
    def _(payload: dict[str, Any]) -> dict[str, Any]:
        payload["total_cents"] = payload.pop("amount_cents")
        return payload

Every event is stored with the version of its class; one stored at an older
version runs through the chain of upcasters (1 -> 2 -> ...) before it is
decoded as the current class.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import msgspec

from .errors import (
    ConfigurationError,
    DecodeError,
    EncodeError,
    FutureEventVersion,
    InvalidUpcaster,
    MissingUpcaster,
)

__all__ = [
    "Event",
    "EventT",
    "Upcaster",
    "check_event_type",
    "check_upcasters",
    "decode_event",
    "encode_event",
    "event_type_of",
    "event_version_of",
]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns a payload of one version (as builtins) into the payload of the next."""

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


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigurationError(f"an event's version is an int of at least 1, got {version!r}")
    return version


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(msgspec.field,))
class _EventMeta(msgspec.StructMeta):
    """Struct metaclass that accepts the ``event_type`` and ``version`` class keywords."""

    def __new__(
        mcls,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        event_type: str | None = None,
        version: int | None = None,
        **kwargs: Any,
    ) -> Any:
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        if event_type is not None:
            cls.__event_type__ = check_event_type(event_type)  # type: ignore[attr-defined]
        if version is not None:
            cls.__event_version__ = _check_version(version)  # type: ignore[attr-defined]
        # A subclass starts from its parent's upcasters (those below its own version).
        inherited = getattr(cls, "__upcasters__", {})
        current = getattr(cls, "__event_version__", 1)
        cls.__upcasters__ = {v: f for v, f in inherited.items() if v < current}  # type: ignore[attr-defined]
        return cls


class Event(msgspec.Struct, metaclass=_EventMeta, frozen=True, kw_only=True):
    """Base class of every event. Subclasses pass ``event_type="…"`` (and ``version=N``)."""

    __event_type__: ClassVar[str] = ""
    __event_version__: ClassVar[int] = 1
    __upcasters__: ClassVar[dict[int, Upcaster]] = {}

    @classmethod
    def upcast(cls, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Declare the upcaster from ``from_version`` to the next version; returns it unchanged.

        :raises InvalidUpcaster: ``from_version`` is not below the class's
            version, or already has an upcaster.
        """
        current = cls.__event_version__
        if isinstance(from_version, bool) or not isinstance(from_version, int) or from_version < 1:
            raise InvalidUpcaster(f"upcast() takes a version of at least 1, got {from_version!r}")
        if from_version >= current:
            raise InvalidUpcaster(
                f"{cls.__qualname__} is at version {current}: an upcaster from version "
                f"{from_version} has nothing to upcast to (raise version= first)"
            )
        if from_version in cls.__upcasters__:
            raise InvalidUpcaster(f"{cls.__qualname__} already has an upcaster from version {from_version}")

        def register(fn: Upcaster) -> Upcaster:
            cls.__upcasters__[from_version] = fn
            return fn

        return register


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


def event_version_of(cls: type[Event]) -> int:
    """Return the version an event class publishes (1 unless it declares ``version=``)."""
    return cls.__event_version__


def check_upcasters(cls: type[Event]) -> None:
    """Refuse a chain of upcasters with a gap: they must run unbroken up to the class's version.

    The chain may start above 1 (older versions are then refused when read,
    with :class:`MissingUpcaster`), but it must end at the class's version.

    :raises InvalidUpcaster: an upcaster is missing between the oldest declared and the class's version.
    """
    declared = cls.__upcasters__
    if not declared:
        return
    missing = [v for v in range(min(declared), cls.__event_version__) if v not in declared]
    if missing:
        raise InvalidUpcaster(
            f"{cls.__qualname__} (version {cls.__event_version__}) has upcasters from "
            f"{sorted(declared)} but none from {missing}: the chain to the current version is broken"
        )


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


def decode_event(cls: type[EventT], payload: bytes, version: int | None = None) -> EventT:
    """Decode JSON bytes stored at ``version`` (None: the class's) to an event of ``cls``.

    An older version runs through the class's upcasters first.

    :raises DecodeError: the payload does not match (:class:`MissingUpcaster`,
        :class:`FutureEventVersion`: its version cannot be brought to the class's).
    """
    if version is not None and version != cls.__event_version__:
        payload = upcast_payload(cls, payload, version)
    try:
        return decoder_for(cls).decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DecodeError(f"payload does not decode as {event_type_of(cls)}: {exc}") from exc


def upcast_payload(cls: type[Event], payload: bytes, version: int) -> bytes:
    """A payload stored at ``version`` brought to the class's version, as JSON bytes."""
    name, current = event_type_of(cls), cls.__event_version__
    if version > current:
        raise FutureEventVersion(
            f"{name} version {version} is newer than {cls.__qualname__} (version {current}): "
            "replay it once code that knows the version runs"
        )
    missing = [v for v in range(version, current) if v not in cls.__upcasters__]
    if missing:
        raise MissingUpcaster(
            f"{name} version {version} cannot be read as version {current}: "
            f"{cls.__qualname__} has no upcaster from version {missing[0]}"
        )
    try:
        data = msgspec.json.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DecodeError(f"payload of {name} version {version} is not JSON: {exc}") from exc
    for v in range(version, current):
        data = _run_upcaster(cls, v, data)
    try:
        return msgspec.json.encode(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DecodeError(f"upcasters of {name} returned a payload that is not JSON: {exc}") from exc


def _run_upcaster(cls: type[Event], from_version: int, data: Any) -> dict[str, Any]:
    name = event_type_of(cls)
    if not isinstance(data, dict):
        raise DecodeError(f"payload of {name} version {from_version} is not a JSON object")
    try:
        result = cls.__upcasters__[from_version](data)
    except Exception as exc:
        raise DecodeError(
            f"upcaster of {name} from version {from_version} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(result, dict):
        raise DecodeError(
            f"upcaster of {name} from version {from_version} returned {type(result).__name__}, not a dict"
        )
    return result
