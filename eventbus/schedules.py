"""Recurring schedules: declarations, occurrence times, and what a tick decides.

A schedule is a row with its spec, policies, next occurrence and last run;
each occurrence is a row keyed by (schedule, scheduled_for) with its fate.
This module is pure: it computes times and plans, the backends apply them in
one transaction on the database clock (see
:class:`eventbus.backends.base.ScheduleStore`).

Times: ``every=`` counts elapsed time from ``anchor`` (the Unix epoch by
default), so DST never applies; ``cron=`` is read in the wall clock of ``tz``
(cron expressions are evaluated by ``cronsim`` on naive wall times, then
mapped to instants with :mod:`zoneinfo` under the schedule's DST policy):

- a wall time that does not exist (the spring gap): ``dst_gap="shift"``
  fires it moved forward by the gap's length (02:30 -> 03:30), ``"skip"``
  records it as ``skipped_dst``;
- a wall time that occurs twice (the autumn fold): ``dst_fold="first"``
  fires the first, ``"last"`` the second, ``"both"`` both; an instant not
  fired is recorded as ``skipped_dst``.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from cronsim import CronSim, CronSimError

from ._priority import checked_priority
from .backends.base import OutgoingEvent, PlannedOccurrence, ScheduleDecl, TickPlan
from .errors import InvalidSchedule
from .event import Event, encode_event, event_type_of, event_version_of
from .types import DstFold, DstGap, MissedPolicy, OverlapPolicy, ScheduleInfo

__all__ = [
    "EPOCH",
    "MAX_BACKFILL",
    "MAX_RECORDED",
    "EventTarget",
    "MachineTarget",
    "Planner",
    "Schedule",
    "ScheduleTarget",
    "occurrence_key",
    "occurrences",
    "window",
]

log = logging.getLogger("eventbus.schedules")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The default ``anchor`` of ``every=`` schedules: the Unix epoch."""
Fate = Literal["due", "skipped_dst"]

# Wall clocks jump by at most this much at a DST change (Debian cron assumes
# the same); around a change, instants are put in order within this window.
_MAX_SHIFT = timedelta(hours=3)
# An occurrence found later than one period (at most this) after its time is
# "missed" even when it is the newest one due.
_MAX_GRACE = timedelta(seconds=60)
# At most this many occurrences of one schedule are recorded per tick (a long
# outage is recorded over several ticks); also the bound of max_catchup.
MAX_RECORDED = 10_000
"""At most this many occurrences of one schedule are recorded per tick; the bound of ``max_catchup``."""
MAX_BACKFILL = 10_000
"""At most this many occurrences may one backfill request (a longer window is refused, not cut)."""
# A schedule that cannot be planned is looked at again this much later.
_RETRY_FAILED = timedelta(seconds=60)
# While an occurrence waits (buffered or requested), the tick looks again this soon.
_RECHECK = timedelta(seconds=1)


def occurrence_key(name: str, scheduled_for: datetime) -> str:
    """The idempotency key of an occurrence's event: ``name@<ISO-8601 UTC>``."""
    return f"{name}@{scheduled_for.astimezone(UTC).isoformat()}"


# -- targets ----------------------------------------------------------------------


class ScheduleTarget(Protocol):
    """What a firing starts. Events are built in; starting a machine plugs in here."""

    @property
    def kind(self) -> Literal["event", "machine"]: ...

    @property
    def name(self) -> str:
        """The event type, or the machine's name."""
        ...

    def work(self, schedule: str, scheduled_for: datetime, delay_seconds: float) -> OutgoingEvent:
        """The work of one firing, published in the tick's transaction."""
        ...


@dataclass(frozen=True)
class EventTarget:
    """Publish ``event_class()`` with ``scheduled_for`` set when the class has that field."""

    event_class: type[Event]

    @property
    def kind(self) -> Literal["event"]:
        return "event"

    @property
    def name(self) -> str:
        return event_type_of(self.event_class)

    def event(self, scheduled_for: datetime) -> Event:
        fields = self.event_class.__struct_fields__
        args = {"scheduled_for": scheduled_for} if "scheduled_for" in fields else {}
        return self.event_class(**args)

    def work(self, schedule: str, scheduled_for: datetime, delay_seconds: float) -> OutgoingEvent:
        return OutgoingEvent(
            event_type=self.name,
            payload=encode_event(self.event(scheduled_for)),
            key=occurrence_key(schedule, scheduled_for),
            delay_seconds=delay_seconds,
            event_version=event_version_of(self.event_class),
        )

    def check(self) -> None:
        """Refuse a class that cannot be built from the occurrence time alone."""
        hints = {f.name: f.type for f in msgspec.structs.fields(self.event_class)}
        kind = hints.get("scheduled_for", datetime)
        if kind is not datetime and set(get_args(kind)) != {datetime, type(None)}:
            raise InvalidSchedule(f"{self.event_class.__qualname__}.scheduled_for must be a datetime")
        try:
            self.event(EPOCH)
        except TypeError as exc:
            raise InvalidSchedule(
                f"{self.event_class.__qualname__} cannot be built by a schedule: every field but "
                f"scheduled_for needs a default ({exc})"
            ) from exc


@dataclass(frozen=True)
class MachineTarget:
    """Start ``machine`` with ``checkpoint(scheduled_for)`` at each firing.

    The firing publishes the machine's start event in the tick's transaction,
    keyed by the occurrence like any firing; the bus's start subscription then
    starts the run, which is idempotent per instance key while a run is live.
    """

    machine: Any
    checkpoint: Callable[[datetime], Any]

    @property
    def kind(self) -> Literal["machine"]:
        return "machine"

    @property
    def name(self) -> str:
        return str(self.machine.name)

    def work(self, schedule: str, scheduled_for: datetime, delay_seconds: float) -> OutgoingEvent:
        data: bytes = self.machine.encode(self.checkpoint(scheduled_for))
        start = self.machine.start_class(checkpoint=data.decode())
        return OutgoingEvent(
            event_type=event_type_of(self.machine.start_class),
            payload=encode_event(start),
            key=occurrence_key(schedule, scheduled_for),
            delay_seconds=delay_seconds,
            event_version=event_version_of(self.machine.start_class),
        )

    def check(self) -> None:
        """Refuse a checkpoint function that does not build the machine's checkpoint."""
        for attr in ("name", "encode", "start_class", "checkpoint"):
            if not hasattr(self.machine, attr):
                raise InvalidSchedule(
                    f"start= takes a state machine (eventbus.workflows.Machine), not {self.machine!r}"
                )
        try:
            sample = self.checkpoint(EPOCH)
        except Exception as exc:
            raise InvalidSchedule(f"checkpoint= failed for a sample occurrence: {exc!r}") from exc
        if not isinstance(sample, self.machine.checkpoint):
            raise InvalidSchedule(
                f"checkpoint= must return a {self.machine.checkpoint.__qualname__}, "
                f"not {type(sample).__qualname__}"
            )


# -- declarations -----------------------------------------------------------------


def _choice(name: str, value: str, allowed: Any) -> None:
    options = get_args(allowed)
    if value not in options:
        raise InvalidSchedule(f"{name} must be one of {', '.join(map(repr, options))}, not {value!r}")


def _seconds(name: str, value: timedelta | float | None) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value or 0)
    if seconds < 0 or math.isnan(seconds):
        raise InvalidSchedule(f"{name} cannot be negative")
    return seconds


@dataclass(frozen=True)
class Schedule:
    """A declared schedule: its name, what it fires, when, and its policies."""

    name: str
    target: ScheduleTarget
    cron: str | None = None
    every: timedelta | None = None
    anchor: datetime = EPOCH
    tz: str = "UTC"
    missed: MissedPolicy = "latest"
    max_catchup: int = 100
    overlap: OverlapPolicy = "allow"
    cooldown: float = 0.0
    jitter: float = 0.0
    dst_gap: DstGap = "shift"
    dst_fold: DstFold = "first"
    priority: int = 0
    """The priority each firing publishes with (lower runs first)."""

    def __post_init__(self) -> None:
        self._check_times()
        checked_priority(self.priority)
        _choice("missed", self.missed, MissedPolicy)
        _choice("overlap", self.overlap, OverlapPolicy)
        _choice("dst_gap", self.dst_gap, DstGap)
        _choice("dst_fold", self.dst_fold, DstFold)
        if not 1 <= self.max_catchup <= MAX_RECORDED:
            raise InvalidSchedule(f"schedule {self.name!r}: max_catchup must be 1 to {MAX_RECORDED}")

    def _check_times(self) -> None:
        if not self.name or "@" in self.name or len(self.name) > 200:
            raise InvalidSchedule(f"schedule name {self.name!r}: 1-200 characters, no '@'")
        if (self.cron is None) == (self.every is None):
            raise InvalidSchedule(f"schedule {self.name!r}: give exactly one of cron= and every=")
        if self.every is not None and self.every <= timedelta(0):
            raise InvalidSchedule(f"schedule {self.name!r}: every= must be positive")
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime(2000, 1, 1))
            except (CronSimError, ValueError) as exc:
                raise InvalidSchedule(f"schedule {self.name!r}: invalid cron {self.cron!r} ({exc})") from exc
        if self.anchor.tzinfo is None:
            raise InvalidSchedule(f"schedule {self.name!r}: anchor must be timezone-aware")
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidSchedule(f"schedule {self.name!r}: unknown time zone {self.tz!r}") from exc

    @classmethod
    def build(
        cls,
        name: str,
        target: ScheduleTarget,
        *,
        cooldown: timedelta | float | None = None,
        jitter: timedelta | float | None = None,
        **options: Any,
    ) -> Schedule:
        """Validate the options of ``bus.schedule``; raises :class:`InvalidSchedule`."""
        return cls(
            name,
            target,
            cooldown=_seconds("cooldown", cooldown),
            jitter=_seconds("jitter", jitter),
            **options,
        )

    def decl(self) -> ScheduleDecl:
        return ScheduleDecl(
            name=self.name,
            target_kind=self.target.kind,
            target=self.target.name,
            cron=self.cron,
            every_seconds=None if self.every is None else self.every.total_seconds(),
            anchor=self.anchor.astimezone(UTC),
            timezone=self.tz,
            missed=self.missed,
            max_catchup=self.max_catchup,
            overlap=self.overlap,
            cooldown_seconds=self.cooldown,
            jitter_seconds=self.jitter,
            dst_gap=self.dst_gap,
            dst_fold=self.dst_fold,
        )


# -- occurrence times ---------------------------------------------------------------


def occurrences(spec: ScheduleDecl | ScheduleInfo, start: datetime) -> Iterator[tuple[datetime, Fate]]:
    """Occurrence instants (UTC) at or after ``start``, in order, each with its fate."""
    if spec.every_seconds is not None:
        return _every(timedelta(seconds=spec.every_seconds), spec.anchor, start)
    assert spec.cron is not None
    return _cron(spec.cron, ZoneInfo(spec.timezone), spec.dst_gap, spec.dst_fold, start)


def _every(period: timedelta, anchor: datetime, start: datetime) -> Iterator[tuple[datetime, Fate]]:
    n = math.ceil((start - anchor) / period)
    while True:
        yield (anchor + n * period).astimezone(UTC), "due"
        n += 1


def _instants(naive: datetime, zone: ZoneInfo, gap: str, fold: str) -> list[tuple[datetime, Fate]]:
    """The instants of one wall-clock time under the DST policy."""
    first = naive.replace(tzinfo=zone, fold=0)
    second = naive.replace(tzinfo=zone, fold=1)
    a, b = first.astimezone(UTC), second.astimezone(UTC)
    if a.astimezone(zone).replace(tzinfo=None) != naive:  # in the gap: fold=0 is shifted forward
        return [(a, "due" if gap == "shift" else "skipped_dst")]
    if a == b:
        return [(a, "due")]
    early, late = min(a, b), max(a, b)
    return [
        (early, "skipped_dst" if fold == "last" else "due"),
        (late, "skipped_dst" if fold == "first" else "due"),
    ]


def _near_change(zone: ZoneInfo, instant: datetime) -> bool:
    return (instant - _MAX_SHIFT).astimezone(zone).utcoffset() != (instant + _MAX_SHIFT).astimezone(
        zone
    ).utcoffset()


def _cron(expr: str, zone: ZoneInfo, gap: str, fold: str, start: datetime) -> Iterator[tuple[datetime, Fate]]:
    """Walk naive wall times with cronsim and emit their instants in order.

    Away from a DST change instants follow wall times; near one they can run
    out of order (a shifted gap time, the second pass of a fold) by at most
    the shift, so candidates wait in a heap until no later wall time can
    come before them.
    """
    begin = (start - _MAX_SHIFT).astimezone(zone).replace(tzinfo=None) - timedelta(seconds=1)
    pending: list[tuple[datetime, Fate]] = []
    seen: set[datetime] = set()
    for naive in CronSim(expr, begin):
        found = _instants(naive, zone, gap, fold)
        for instant, fate in found:
            if instant >= start and instant not in seen:
                seen.add(instant)
                heapq.heappush(pending, (instant, fate))
        low = found[0][0]
        bound = low - _MAX_SHIFT if _near_change(zone, low) else low
        while pending and pending[0][0] <= bound:
            instant, fate = heapq.heappop(pending)
            seen.discard(instant)
            yield instant, fate


def window(spec: ScheduleDecl | ScheduleInfo, start: datetime, end: datetime) -> list[tuple[datetime, Fate]]:
    """Occurrences in ``[start, end]``."""
    found = []
    for instant, fate in occurrences(spec, start):
        if instant > end:
            break
        found.append((instant, fate))
    return found


def backfill_times(
    spec: ScheduleDecl | ScheduleInfo, start: datetime, end: datetime, stop: datetime
) -> list[datetime]:
    """The due occurrences in ``[start, end]`` before ``stop`` (the schedule's next occurrence).

    Lazy: the walk ends at ``end`` or ``stop``, whichever comes first, so a
    window reaching into the future computes nothing past the present; and
    :class:`InvalidSchedule` is raised as soon as the window holds more than
    :data:`MAX_BACKFILL` occurrences, before the rest are computed.
    """
    times: list[datetime] = []
    for instant, fate in occurrences(spec, start):
        if instant > end or instant >= stop:
            break
        if fate != "due":
            continue
        if len(times) == MAX_BACKFILL:
            raise InvalidSchedule(
                f"backfill of {spec.name!r} from {start.isoformat()} asks for more than "
                f"{MAX_BACKFILL} occurrences; backfill a shorter window at a time"
            )
        times.append(instant)
    return times


# -- the tick's decisions -------------------------------------------------------------


@dataclass
class _Plan:
    """A plan being built for one schedule."""

    schedule: Schedule
    now: datetime
    upcoming: datetime
    busy: bool
    buffered_for: datetime | None
    items: list[PlannedOccurrence]

    def fire(self, when: datetime, existing: bool = False) -> None:
        room = max(0.0, (self.upcoming - self.now).total_seconds())
        jitter = min(self.schedule.jitter, room)
        delay = random.uniform(0.0, jitter) if jitter else 0.0
        work = self.schedule.target.work(self.schedule.name, when, delay)
        if self.schedule.priority:
            work = msgspec.structs.replace(work, priority=self.schedule.priority)
        self.items.append(PlannedOccurrence(when, "fired", work, existing))
        self.busy = True

    def record(self, when: datetime, status: Any) -> None:
        self.items.append(PlannedOccurrence(when, status))

    def offer(self, when: datetime) -> None:
        """An occurrence due now: fired, buffered or skipped by the overlap policy."""
        overlap = self.schedule.overlap
        if overlap == "allow" or not self.busy:
            self.fire(when)
        elif overlap == "buffer_one" and self.buffered_for is None:
            self.buffered_for = when
            self.record(when, "buffered")
        else:
            self.record(when, "skipped_overlap")


class Planner:
    """The :class:`~eventbus.backends.base.SchedulePlanner` of a bus's declared schedules."""

    def __init__(self, schedules: dict[str, Schedule]) -> None:
        self.by_name = dict(schedules)
        self._names = sorted(self.by_name)
        self.set_id = hashlib.sha256("\n".join(self._names).encode()).hexdigest()[:32]

    def names(self) -> Sequence[str]:
        return self._names

    def first_occurrence(self, decl: ScheduleDecl, start: datetime) -> datetime:
        return next(occurrences(decl, start))[0]

    def plan(self, row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        """The tick of one schedule; a schedule that cannot be planned waits a minute (logged).

        One broken schedule must neither stop the ticker nor roll back the
        other schedules of its batch.
        """
        try:
            return self._plan(row, now, requested)
        except Exception:
            log.exception("schedule %r could not be planned; trying again in a minute", row.name)
            return TickPlan((), row.next_occurrence_at, now + _RETRY_FAILED, row.buffered_for, failed=True)

    def _plan(self, row: ScheduleInfo, now: datetime, requested: Sequence[datetime]) -> TickPlan:
        schedule = self.by_name[row.name]
        busy = row.last_event_id is not None and row.last_finished_at is None
        p = _Plan(schedule, now, row.next_occurrence_at, busy, row.buffered_for, [])
        for when in requested:
            p.fire(when, existing=True)
        cooling = self._cooling_until(row, p.busy)
        if row.paused or (cooling is not None and cooling > now):
            return self._done(p, row.next_occurrence_at, cooling or row.next_run_at)
        due, p.upcoming, overflow = self._due(row, now)
        if overflow:  # a long outage: record it a chunk at a time; all of it is missed
            for when, fate in due:
                p.record(when, "skipped_dst" if fate == "skipped_dst" else "skipped_missed")
            return self._done(p, p.upcoming, now)
        if p.buffered_for is not None and not p.busy:
            p.fire(p.buffered_for, existing=True)
            p.buffered_for = None
        self._classify(p, due, now)
        return self._done(p, p.upcoming, p.upcoming)

    def _due(self, row: ScheduleInfo, now: datetime) -> tuple[list[tuple[datetime, Fate]], datetime, bool]:
        """Occurrences due by ``now``, the next one, and whether more are due than one tick records.

        On overflow the first :data:`MAX_RECORDED` are returned and at least
        ``max_catchup`` more are due after them, so none of them is among the
        newest ``max_catchup``.
        """
        due: list[tuple[datetime, Fate]] = []
        limit = MAX_RECORDED + row.max_catchup
        for instant, fate in occurrences(row, row.next_occurrence_at):
            if instant > now:
                return due, instant, False
            if len(due) == limit:
                return due[:MAX_RECORDED], due[MAX_RECORDED][0], True
            due.append((instant, fate))
        raise AssertionError("occurrences never end")  # pragma: no cover

    def _cooling_until(self, row: ScheduleInfo, busy: bool) -> datetime | None:
        schedule = self.by_name[row.name]
        if busy or not schedule.cooldown or row.last_finished_at is None:
            return None
        return row.last_finished_at + timedelta(seconds=schedule.cooldown)

    def _classify(self, p: _Plan, due: list[tuple[datetime, Fate]], now: datetime) -> None:
        """Apply the missed-run policy, then the overlap policy, to the occurrences due."""
        real = [t for t, fate in due if fate == "due"]
        fire: list[datetime] = []
        if real:
            newest = real[-1]
            on_time = now - newest <= min(_MAX_GRACE, p.upcoming - newest)
            missed = p.schedule.missed
            if missed == "all":
                fire = real[-p.schedule.max_catchup :]
            elif missed == "latest" or on_time:
                fire = [newest]
        chosen = set(fire)
        for when, fate in due:
            if fate == "skipped_dst":
                p.record(when, "skipped_dst")
            elif when in chosen:
                p.offer(when)
            else:
                p.record(when, "skipped_missed")

    @staticmethod
    def _done(p: _Plan, next_occurrence_at: datetime, next_run_at: datetime) -> TickPlan:
        if p.buffered_for is not None:
            next_run_at = min(next_run_at, p.now + _RECHECK)
        return TickPlan(
            occurrences=p.items,
            next_occurrence_at=next_occurrence_at,
            next_run_at=next_run_at,
            buffered_for=p.buffered_for,
        )
