"""Filters from a query string or a form, checked into the bus's filter types."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from ..errors import ConfigurationError, NotFound
from ..types import DeliveryCondition, DeliveryFilter, DeliveryStatus

__all__ = [
    "CONDITIONS",
    "STATUSES",
    "dead_filter",
    "delivery_filter",
    "int_field",
    "path_id",
    "query_of",
    "text_field",
]

STATUSES = ("pending", "processing", "completed", "dead", "cancelled")
CONDITIONS = ("stuck", "retrying")
DELIVERY_FIELDS = (
    "subscription", "status", "event_type", "event_id", "key", "correlation_id",
    "since", "until", "payload_path", "payload_value", "condition",
)  # fmt: skip
DEAD_FIELDS = ("subscription", "event_type", "since")
MAX_ID = 2**63 - 1
"""The largest id either backend stores (a signed 64-bit integer)."""


def text_field(values: Mapping[str, Any], name: str) -> str | None:
    value = values.get(name)
    return value.strip() or None if isinstance(value, str) else None


def int_field(values: Mapping[str, Any], name: str) -> int | None:
    text = text_field(values, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {text!r}") from None
    if not 0 <= value <= MAX_ID:
        raise ConfigurationError(f"{name} must be a whole number from 0 to {MAX_ID}, got {text!r}")
    return value


def path_id(text: str, what: str) -> int:
    """An id from the path; one that cannot exist (not a number, out of range) is :class:`NotFound`."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 < value <= MAX_ID:
        raise NotFound(f"no such {what}: {text[:40]!r}")
    return value


def _time(values: Mapping[str, Any], name: str) -> datetime | None:
    """An ISO time; without a zone it is UTC (what the pages show)."""
    text = text_field(values, name)
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(f"{name} must be a time like 2026-01-31T12:00, got {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def delivery_filter(values: Mapping[str, Any]) -> DeliveryFilter:
    status = text_field(values, "status")
    if status is not None and status not in STATUSES:
        raise ConfigurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    condition = text_field(values, "condition")
    if condition is not None and condition not in CONDITIONS:
        raise ConfigurationError(f"condition must be stuck or retrying, got {condition!r}")
    return DeliveryFilter(
        subscription=text_field(values, "subscription"),
        status=cast(DeliveryStatus | None, status),
        event_type=text_field(values, "event_type"),
        event_id=int_field(values, "event_id"),
        key=text_field(values, "key"),
        correlation_id=int_field(values, "correlation_id"),
        since=_time(values, "since"),
        until=_time(values, "until"),
        payload_path=text_field(values, "payload_path"),
        payload_value=text_field(values, "payload_value"),
        condition=cast(DeliveryCondition | None, condition),
    )


def dead_filter(values: Mapping[str, Any]) -> DeliveryFilter:
    """The dead letters matching the fields bulk replay and purge walk by."""
    return DeliveryFilter(
        status="dead",
        subscription=text_field(values, "subscription"),
        event_type=text_field(values, "event_type"),
        since=_time(values, "since"),
    )


def query_of(values: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, str]:
    """The filter fields that are set, to carry into links and hidden form fields."""
    return {f: v for f in fields if (v := text_field(values, f)) is not None}
