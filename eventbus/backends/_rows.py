"""One row-to-struct conversion for every backend.

A driver row (an asyncpg ``Record`` or a ``sqlite3.Row``) is a mapping of
column names to values; :func:`row_as` turns it into the port's struct with
msgspec, which checks each field's type on the way. Columns the struct does
not declare are ignored. JSON columns are named in ``json`` and decoded
first; SQLite's ISO-8601 text times become ``datetime`` through msgspec's
lenient conversion (``strict=False``), as do its 0/1 booleans.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import msgspec
import orjson

from ..types import DeliveryStatus, StatusReport, StatusRow

__all__ = ["row_as", "rows_as", "windowed"]

T = TypeVar("T")


def _mapping(row: Any, json: Sequence[str]) -> dict[str, Any]:
    # A driver row iterates its values in the order of its keys: zipping the two
    # is twice as fast as looking each column up by name.
    data = dict(row) if isinstance(row, dict) else dict(zip(row.keys(), row, strict=True))
    for name in json:
        value = data.get(name)
        if isinstance(value, (str, bytes)):
            data[name] = orjson.loads(value)
    return data


def row_as(
    cls: type[T],
    row: Any,
    *,
    json: Sequence[str] = (),
    **extra: Any,
) -> T:
    """``row`` as a ``cls``: its columns by name, ``json`` columns decoded, ``extra`` fields added."""
    data = _mapping(row, json)
    data.update(extra)
    return msgspec.convert(data, cls, strict=False)


def rows_as(cls: type[T], rows: Iterable[Any], *, json: Sequence[str] = ()) -> list[T]:
    """:func:`row_as` for each of ``rows``, in order."""
    return [row_as(cls, row, json=json) for row in rows]


def windowed(report: StatusReport, recent: Sequence[StatusRow], window: int) -> StatusReport:
    """``report`` (a StatusReport) with its rows bounded: completed and cancelled
    counted among the newest ``window`` deliveries (``recent``, StatusRows), pending,
    processing and dead exact from its subscriptions (their partial indexes)."""
    backlog: tuple[DeliveryStatus, ...] = ("pending", "processing", "dead")
    exact = [
        StatusRow(s.event_type, s.name, status, n)
        for s in report.subscriptions
        for status, n in zip(backlog, (s.pending, s.processing, s.dead), strict=True)
        if n
    ]
    kept = [r for r in recent if r.status in ("completed", "cancelled")]
    rows = sorted([*exact, *kept], key=lambda r: (r.event_type, r.subscription, r.status))
    full = sum(r.count for r in recent) >= window
    return msgspec.structs.replace(report, rows=rows, window=window, window_full=full)
