"""Triage by cause: dead letters and failing deliveries grouped by error type and normalised message.

A message is normalised by replacing what varies from one delivery to the
next (UUIDs, hex strings, quoted strings, numbers, ids mixing letters and
digits) with placeholders, so "order 1234 not found" and "order 98 not
found" fall in one group, ``KeyError: order <n> not found``. The grouping
reads the newest ``sample`` matching deliveries through the dashboard's paged
index reads and groups them here: past the sample, counts are lower bounds
(:attr:`Triage.capped`). A group's :attr:`ErrorGroup.filter` matches its
deliveries in the database (``message_pattern``), so replay, purge and cancel
act on everything in it, not only on the sample.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

import msgspec

from .bus import Bus, _checked_filter
from .errors import ConfigurationError
from .types import DeliveryFilter, DeliveryRow

__all__ = ["DEFAULT_SAMPLE", "ErrorGroup", "Triage", "error_groups", "error_type_of", "failing", "normalise"]

DEFAULT_SAMPLE = 10_000
"""The newest matching deliveries a grouping reads at most."""
MAX_SAMPLE = 100_000
MESSAGE_CHARS = 300
"""A normalised message is cut here (and ends with ``…``, which then matches any rest)."""
_TYPE = re.compile(r"^([A-Za-z_][\w.]*): ")
_HEX = "[0-9a-fA-F]"
_RULES = [
    (re.compile(rf"\b{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}\b"), "<uuid>"),
    (re.compile(r"'[^'\n]*'|\"[^\"\n]*\""), "<str>"),
    (re.compile(rf"\b0x{_HEX}+\b|\b(?={_HEX}*[a-fA-F])(?={_HEX}*\d){_HEX}{{8,}}\b"), "<hex>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?=(?:[a-zA-Z]{1,3})?(?![\w.]))"), "<n>"),
    (re.compile(r"\b(?=\w*\d)(?=\w*[A-Za-z])\w+\b"), "<id>"),
]  # fmt: skip
"""In order: a UUID is not read as hex and numbers, a quoted string is one placeholder whatever it holds;
a number may be dotted (``10.0.3.1``, ``2.5``) and keeps a short unit after it (``3s`` becomes ``<n>s``)."""


class ErrorGroup(msgspec.Struct, frozen=True):
    """Deliveries of one subscription failing with one error type and normalised message."""

    subscription: str
    error_type: str
    message: str
    """The normalised message (placeholders for what varies)."""
    count: int
    """In the sample: a lower bound when the sample was capped."""
    first_seen: datetime
    last_seen: datetime
    example_id: int
    """The newest delivery of the group (its attempt history has the traceback)."""
    example: str
    """Its error as written."""
    filter: DeliveryFilter
    """The filter matching the group's deliveries in the database (beyond the sample)."""


class Triage(msgspec.Struct, frozen=True):
    groups: Sequence[ErrorGroup]
    """Largest first."""
    scanned: int
    """Deliveries read."""
    capped: bool
    """True when more matched than the sample read: counts are lower bounds."""


def error_type_of(error: str) -> str:
    """The exception type a last error starts with (``KeyError: …``), or ``""``."""
    match = _TYPE.match(error)
    return match.group(1) if match else ""


def normalise(error: str) -> str:
    """``error`` with what varies replaced by placeholders, cut to :data:`MESSAGE_CHARS`.

    The exception type it starts with is kept as written (``Http2Error: …``).
    """
    kind = error_type_of(error)
    message = error[len(kind) + 2 :] if kind else error
    for rule, placeholder in _RULES:
        message = rule.sub(placeholder, message)
    message = f"{kind}: {message}" if kind else message
    return message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"


def failing(flt: DeliveryFilter) -> DeliveryFilter:
    """``flt`` for the deliveries waiting to retry after a failure (pending, with an error)."""
    return msgspec.structs.replace(
        flt, status="pending", error_contains="" if flt.error_contains is None else flt.error_contains
    )


async def error_groups(bus: Bus, flt: DeliveryFilter, *, sample: int = DEFAULT_SAMPLE) -> Triage:
    """The deliveries matching ``flt`` (dead letters, or :func:`failing` ones) grouped by cause.

    Reads the newest ``sample`` of them in one newest-first index walk and
    groups them by subscription, error type and normalised message.
    """
    if not 1 <= sample <= MAX_SAMPLE:
        raise ConfigurationError(f"sample must be 1 to {MAX_SAMPLE}, got {sample}")
    # One read of the index walk the dashboard's lists use, one row past the
    # sample to tell whether it was capped (pages of the public listing would
    # plan and join the same rows a dozen times over).
    rows = await bus.backend.inspect.find(_checked_filter(flt), sample + 1)
    capped = len(rows) > sample
    return Triage(groups=_grouped(rows[:sample], flt), scanned=min(len(rows), sample), capped=capped)


def _grouped(rows: Sequence[DeliveryRow], flt: DeliveryFilter) -> list[ErrorGroup]:
    found: dict[tuple[str, str], list[DeliveryRow]] = {}
    for row in rows:  # newest first
        error = row.last_error or ""
        found.setdefault((row.subscription, normalise(error)), []).append(row)
    groups = [_group(sub, message, members, flt) for (sub, message), members in found.items()]
    return sorted(groups, key=lambda g: (-g.count, g.subscription, g.message))


def _group(subscription: str, message: str, members: list[DeliveryRow], flt: DeliveryFilter) -> ErrorGroup:
    newest = members[0]
    times = [m.updated_at for m in members]
    return ErrorGroup(
        subscription=subscription, error_type=error_type_of(message), message=message,
        count=len(members), first_seen=min(times), last_seen=max(times), example_id=newest.id,
        example=newest.last_error or "",
        filter=msgspec.structs.replace(flt, subscription=subscription, message_pattern=message),
    )  # fmt: skip
