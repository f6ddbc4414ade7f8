"""Throughput, failures, backlog and handler durations over the last hour or day.

Read them with ``await bus.throughput(subscription=None, window="1h")``
(:class:`ThroughputReader`); the dashboard's ``/charts``
page draws them. They come from a small rollup table, never from a scan of
the deliveries:

- each worker counts, per subscription and minute, the handler runs that
  completed, failed (to be retried) and went dead, with a histogram of their
  durations, in memory; about every ten seconds it appends one row per
  (subscription, minute) that has ended, and at shutdown the rest. Rows are
  only inserted: several workers' rows of a minute are summed by the reader;
- once a minute, the first worker to try samples each subscription's queue:
  its pending deliveries (counted no further than :data:`DEPTH_CAP`) and the
  age of its oldest due one (lag).

Durations fall in fixed log-spaced buckets (four per doubling from 0.1 ms,
:func:`bucket_of`), so histograms of any workers and minutes merge by adding
counts, and a percentile read from them is within about 9% of the true
value. ``Bus(rollup=False)`` turns the counting, the flushes and the samples
off. Retention deletes the rows after ``Retention.rollup_retention`` (two days).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from math import ceil, log2
from typing import Literal

import msgspec

from .backends.ports import Inspector, RollupBucket, RollupRow
from .errors import ConfigurationError

__all__ = [
    "COMPLETED",
    "DEAD",
    "DEPTH_CAP",
    "FAILED",
    "WINDOWS",
    "HandlerDurations",
    "Rollup",
    "Throughput",
    "ThroughputPoint",
    "ThroughputReader",
    "Window",
    "bucket_of",
    "bucket_seconds",
    "percentile",
    "throughput_of",
    "window_of",
    "window_start",
]

BASE_SECONDS = 0.0001
"""The upper bound of the first duration bucket: every run up to 0.1 ms."""
PER_DOUBLING = 4
"""Buckets per doubling of the duration: each spans a factor of 2 ** (1/4), about 19%."""
LAST_BUCKET = 127
"""The last bucket holds every run longer than about 3.8 days."""
DEPTH_CAP = 1_000_000
"""A queue sample counts pending deliveries no further than this."""
MAX_CELLS = 100_000
"""The most (subscription, minute) cells a worker keeps while the database refuses its flushes."""

COMPLETED, FAILED, DEAD = 0, 1, 2
"""The outcomes :meth:`Rollup.add` counts."""

Window = Literal["1h", "1d"]
WINDOWS: dict[str, tuple[int, int]] = {"1h": (3600, 60), "1d": (86400, 600)}
"""Each window's length and step, in seconds: minutes over the hour, ten minutes over the day."""


def bucket_of(seconds: float) -> int:
    """The duration bucket of a run of ``seconds``: 0 up to 0.1 ms, then four per doubling."""
    if seconds <= BASE_SECONDS:
        return 0
    return min(LAST_BUCKET, math.ceil(math.log2(seconds / BASE_SECONDS) * PER_DOUBLING))


def bucket_seconds(bucket: int) -> float:
    """The duration a bucket stands for: its geometric middle (its bound, for the first)."""
    if bucket <= 0:
        return BASE_SECONDS
    return BASE_SECONDS * 2 ** ((bucket - 0.5) / PER_DOUBLING)


def percentile(durations: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a histogram of runs by bucket; None when it is empty."""
    total = sum(durations.values())
    if total <= 0:
        return None
    rank, seen = q * total, 0
    for bucket in sorted(durations):
        seen += durations[bucket]
        if seen >= rank:
            return bucket_seconds(bucket)
    return bucket_seconds(max(durations))


def _merged(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in histograms:
        for bucket, runs in h.items():
            out[bucket] = out.get(bucket, 0) + runs
    return out


@dataclass(slots=True)
class _Cell:
    """What a worker counted for one (subscription, minute)."""

    counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    """Completed, failed, dead (indexed by COMPLETED, FAILED, DEAD)."""
    durations: dict[int, int] = field(default_factory=dict)


class Rollup:
    """One worker's counts per (subscription, minute), in memory until they are flushed.

    :meth:`add` is on the hot path: a clock read, two dict lookups and two
    increments while the minute lasts (the minute's cells are kept apart, so
    no key is built per run).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._minutes: dict[int, dict[str, _Cell]] = {}
        self._current: dict[str, _Cell] = {}
        self._start, self._end = 0.0, 0.0
        """The minute :attr:`_current` counts: [start, end) in epoch seconds."""

    def add(self, subscription: str, outcome: int, seconds: float) -> None:
        """Count one handler run of ``seconds`` that ended with ``outcome`` (COMPLETED, FAILED, DEAD)."""
        now = self.clock()
        if not self._start <= now < self._end:
            self._enter(now)
        cell = self._current.get(subscription)
        if cell is None:
            cell = self._current[subscription] = _Cell()
        cell.counts[outcome] += 1
        bucket = 0  # bucket_of, inlined: this runs once per delivery
        if seconds > BASE_SECONDS:
            bucket = min(LAST_BUCKET, ceil(log2(seconds / BASE_SECONDS) * PER_DOUBLING))
        hist = cell.durations
        hist[bucket] = hist.get(bucket, 0) + 1

    def _enter(self, now: float) -> None:
        minute = int(now) // 60 * 60
        self._current = self._minutes.setdefault(minute, {})
        self._start, self._end = float(minute), float(minute + 60)

    def __len__(self) -> int:
        return sum(len(cells) for cells in self._minutes.values())

    def take(self, *, everything: bool = False) -> list[RollupRow]:
        """The cells of minutes that have ended (``everything``: all of them), removed from memory."""
        now_minute = int(self.clock()) // 60 * 60
        ended = [m for m in self._minutes if everything or m < now_minute]
        rows = [_row(name, m, cell) for m in ended for name, cell in self._minutes.pop(m).items()]
        if everything or self._start < now_minute:
            self._current, self._start, self._end = {}, 0.0, 0.0  # the next add starts its minute afresh
        return rows

    def put_back(self, rows: Sequence[RollupRow]) -> None:
        """Rows a flush could not store, counted again (the oldest minutes go past :data:`MAX_CELLS`)."""
        for r in rows:
            cell = self._minutes.setdefault(r.minute, {}).setdefault(r.subscription, _Cell())
            for i, n in enumerate((r.completed, r.failed, r.dead)):
                cell.counts[i] += n
            cell.durations = _merged([cell.durations, r.durations])
        while len(self) > MAX_CELLS and len(self._minutes) > 1:
            del self._minutes[min(self._minutes)]


def _row(subscription: str, minute: int, cell: _Cell) -> RollupRow:
    completed, failed, dead = cell.counts
    return RollupRow(subscription, minute, completed, failed, dead, cell.durations)


class ThroughputPoint(msgspec.Struct, frozen=True):
    """One step of a window: handler runs that ended in it, their durations, and the queue."""

    start: datetime
    completed: int = 0
    failed: int = 0
    """Failed attempts that will be retried."""
    dead: int = 0
    """Failed attempts that went to the dead-letter queue."""
    p50_seconds: float | None = None
    p95_seconds: float | None = None
    p99_seconds: float | None = None
    depth: int | None = None
    """Pending deliveries when the queue was sampled (the step's largest sample; None: not sampled)."""
    lag_seconds: float | None = None
    """Age of the oldest due pending delivery when sampled (None: not sampled, or none was due)."""


class HandlerDurations(msgspec.Struct, frozen=True):
    """One subscription's handler runs over the whole window, with their duration percentiles."""

    subscription: str
    completed: int
    failed: int
    dead: int
    p50_seconds: float | None
    p95_seconds: float | None
    p99_seconds: float | None

    @property
    def runs(self) -> int:
        return self.completed + self.failed + self.dead


class Throughput(msgspec.Struct, frozen=True):
    """What ``bus.throughput(...)`` returns (:class:`ThroughputReader`)."""

    window: str
    step_seconds: int
    start: datetime
    """The first step's start (UTC)."""
    subscription: str | None
    """The one subscription asked for, or None for all."""
    points: list[ThroughputPoint]
    """Every step of the window, oldest first, summed over the subscriptions (zero where nothing ran)."""
    subscriptions: dict[str, list[ThroughputPoint]]
    """The same steps for each subscription with rows in the window, by name."""
    handlers: list[HandlerDurations]
    """Each subscription's runs and duration percentiles over the window, by name."""


def window_of(window: str) -> tuple[int, int]:
    """The length and step of a window name; :class:`ConfigurationError` for another name."""
    try:
        return WINDOWS[window]
    except (KeyError, TypeError):
        names = ", ".join(WINDOWS)
        raise ConfigurationError(f"window must be one of {names}, got {window!r}") from None


def _point(start: int, buckets: Sequence[RollupBucket]) -> ThroughputPoint:
    hist = _merged(b.durations for b in buckets)
    depths = [b.pending for b in buckets if b.pending is not None]
    lags = [b.lag_seconds for b in buckets if b.lag_seconds is not None]
    return ThroughputPoint(
        start=datetime.fromtimestamp(start, UTC),
        completed=sum(b.completed for b in buckets), failed=sum(b.failed for b in buckets),
        dead=sum(b.dead for b in buckets),
        p50_seconds=percentile(hist, 0.5), p95_seconds=percentile(hist, 0.95),
        p99_seconds=percentile(hist, 0.99),
        depth=sum(depths) if depths else None, lag_seconds=max(lags) if lags else None,
    )  # fmt: skip


def _series(starts: Sequence[int], buckets: Sequence[RollupBucket]) -> list[ThroughputPoint]:
    by_start: dict[int, list[RollupBucket]] = {}
    for b in buckets:
        by_start.setdefault(b.start, []).append(b)
    return [_point(s, by_start.get(s, [])) for s in starts]


def _handler(name: str, buckets: Sequence[RollupBucket]) -> HandlerDurations:
    hist = _merged(b.durations for b in buckets)
    return HandlerDurations(
        subscription=name, completed=sum(b.completed for b in buckets),
        failed=sum(b.failed for b in buckets), dead=sum(b.dead for b in buckets),
        p50_seconds=percentile(hist, 0.5), p95_seconds=percentile(hist, 0.95),
        p99_seconds=percentile(hist, 0.99),
    )  # fmt: skip


def window_start(window: str, now: float) -> int:
    """The first step's start of ``window`` ending with the step that holds ``now`` (epoch seconds)."""
    length, step = window_of(window)
    return int(now) // step * step - length + step


def throughput_of(
    buckets: Sequence[RollupBucket], window: str, now: float, subscription: str | None = None
) -> Throughput:
    """The points, series and handler table of ``window`` from the backend's rollup steps."""
    length, step = window_of(window)
    first = window_start(window, now)
    starts = list(range(first, first + length, step))
    kept = [b for b in buckets if b.start >= first]
    names = sorted({b.subscription for b in kept})
    per_name = {n: [b for b in kept if b.subscription == n] for n in names}
    return Throughput(
        window=window, step_seconds=step, start=datetime.fromtimestamp(first, UTC), subscription=subscription,
        points=_series(starts, kept), subscriptions={n: _series(starts, per_name[n]) for n in names},
        handlers=[_handler(n, per_name[n]) for n in names if any(b.durations for b in per_name[n])],
    )  # fmt: skip


class ThroughputReader:
    """``bus.throughput``: call it for the rollup of a window (``await bus.throughput(...)``)."""

    def __init__(self, inspector: Callable[[], Inspector]) -> None:
        self._inspector = inspector

    async def __call__(self, subscription: str | None = None, *, window: str = "1h") -> Throughput:
        """Completed, failed and dead runs, duration percentiles, queue depth and lag over ``window``.

        ``window``: ``"1h"`` (one point a minute) or ``"1d"`` (one point per ten
        minutes); ``subscription``: one subscription's alone (default: all,
        summed, with each subscription's series beside). Read from the
        throughput rollup the workers keep, never from the deliveries; a
        minute appears once it has ended (about ten seconds later).
        :class:`~eventbus.ConfigurationError` for another window.
        """
        step, now = window_of(window)[1], time.time()
        buckets = await self._inspector().rollup(window_start(window, now), step, subscription)
        return throughput_of(buckets, window, now, subscription)
