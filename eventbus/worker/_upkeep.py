"""The worker's upkeep: everything it runs beside claiming and handling, each as a :class:`Service`.

- lease renewal: the leases of every run this worker holds, a third of the
  shortest lease apart (in burst mode too);
- storage upkeep: the store's own, when it has one (PostgreSQL's append-only
  ring: rotation and pruning of its slots), every
  ``deliveries.upkeep_seconds``, in burst mode too;
- lease recovery: expired leases of any worker back to pending, and
  backfills whose publishes have settled finished, every
  ``recovery_interval_seconds`` (a cheap partial-index probe);
- liveness: this worker's row in ``workers``, about every five seconds;
- worker rescue: every ``recovery_interval_seconds``, the processing
  deliveries of workers lost for ``rescue_after_seconds`` (no heartbeat by the
  database's clock, or a process gone from this host) back to pending, before
  their leases run out;
- schedule ticks: every worker ticks, no leader. The bus's schedules are
  recorded when the worker starts; each tick claims due schedules in one
  guarded transaction (see :class:`eventbus.backends.base.ScheduleStore`),
  and the next follows when the next schedule is due by the database's clock
  (at least 50 ms, at most a second later), so a schedule fires within about
  a second of its time, usually within tens of milliseconds, and a new
  trigger is seen as soon;
- retention: a pruning pass every ``Retention.interval``, one pruner at a time;
- the throughput rollup (unless ``Bus(rollup=False)``): every ten seconds the
  counts of the minutes that have ended are appended (in burst mode too), and
  once a minute the queues are sampled, unless another worker did
  (see :mod:`eventbus.throughput`).

A database error is logged and the service goes on at its next turn; only a
burst run (drain) is limited to lease renewal.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio

from ..backends._wakeup import SWEEP
from ..backends.base import RollupStore, SchedulePlanner
from ..errors import BackendError
from ..retention import Pruner
from ..throughput import DEPTH_CAP, Rollup

if TYPE_CHECKING:
    from ..bus import Bus
    from . import Worker

__all__ = [
    "Periodic", "RollupTurns", "ScheduleTicks", "Service", "Stopping", "flush_rollup", "report_alive",
    "upkeep_services",
]  # fmt: skip

log = logging.getLogger("eventbus.worker")
retention_log = logging.getLogger("eventbus.retention")

Stopping = Callable[[], bool]
"""True once the worker is stopping: it claims no more and waits for its handlers."""

BEAT_SECONDS = 5.0
"""About how often a worker reports in."""

ROLLUP_FLUSH_SECONDS = 10.0
"""About how often a worker appends the rollup of the minutes that have ended."""


class Service(Protocol):
    """One upkeep task of a worker.

    ``run`` goes on until the worker cancels it when it is done; a service may
    end sooner, once it has nothing (more) to do or once ``stopping()``.
    """

    name: str

    async def run(self, stopping: Stopping) -> None: ...


@dataclass
class Periodic:
    """A service that takes one ``turn`` every ``every`` seconds, the first after ``first_after``."""

    name: str
    every: float
    turn: Callable[[], Awaitable[None]]
    first_after: float = 0.0

    async def run(self, stopping: Stopping) -> None:
        if self.first_after:
            await anyio.sleep(self.first_after)
        while True:
            await self.turn()
            await anyio.sleep(self.every)


def upkeep_services(bus: Bus, worker: Worker) -> list[Service]:
    """The services ``worker`` runs for ``bus``; in burst mode only renewal, storage upkeep, rollup."""
    leases = [a.sub.lease_seconds for a in worker._claims.active.values()] or [30.0]
    renewal = Periodic("lease renewal", min(leases) / 3, lambda: _renew_leases(worker), min(leases) / 3)
    rollup = _rollup(bus, worker)
    every = worker.deliveries.upkeep_seconds
    storage = [Periodic("storage upkeep", every, lambda: _storage_upkeep(worker))] if every else []
    if worker.burst:
        return [renewal, *storage, *rollup]
    interval = worker.recovery_interval_seconds
    services: list[Service] = [
        renewal,
        *storage,
        Periodic("lease recovery", interval, lambda: _recover_leases(worker)),
        *_rescue(bus, worker),
        Periodic("liveness", interval * max(1, round(BEAT_SECONDS / interval)), lambda: report_alive(worker)),
        ScheduleTicks(bus),
        *rollup,
    ]
    return services + _retention(bus)


def _rollup(bus: Bus, worker: Worker) -> list[Service]:
    """The rollup's flushes (and, but in burst mode, the queue samples), unless it is off."""
    if worker.rollup is None:
        return []
    turns = RollupTurns(bus.backend.rollup, worker.rollup, sample=not worker.burst)
    return [Periodic("throughput rollup", ROLLUP_FLUSH_SECONDS, turns.turn, ROLLUP_FLUSH_SECONDS / 2)]


@dataclass
class RollupTurns:
    """Appending the rollup of the minutes that have ended; sampling the queues once a minute."""

    store: RollupStore
    rollup: Rollup
    sample: bool
    sampled_minute: int = -1
    """The last minute this worker sampled, or found sampled."""

    async def turn(self) -> None:
        await flush_rollup(self.store, self.rollup)
        minute = int(time.time()) // 60 * 60
        if not self.sample or minute == self.sampled_minute:
            return
        try:
            await self.store.sample_queues(minute, DEPTH_CAP)
        except BackendError as exc:
            log.warning("queue sample not written: %s", exc)
            return
        self.sampled_minute = minute


async def flush_rollup(store: RollupStore, rollup: Rollup, *, everything: bool = False) -> None:
    """Append the rollup of the minutes that have ended (``everything``: all it holds, on stop).

    Rows the database refuses are kept for the next flush.
    """
    rows = rollup.take(everything=everything)
    if not rows:
        return
    try:
        await store.record(rows)
    except BackendError as exc:
        rollup.put_back(rows)
        log.warning("throughput rollup not written (%d rows kept for the next flush): %s", len(rows), exc)


_WRITE_WAIT_SECONDS = 1.0
"""How long a renewal that missed some runs waits for a result write in progress before it
calls their leases lost (every other lease of the turn is renewed before it waits)."""


async def _renew_leases(worker: Worker) -> None:
    """Extend the leases of every run this worker holds: one call per lease token."""
    in_flight = worker._claims.in_flight
    missed: list[tuple[int, str]] = []
    for (token, lease_seconds), ids in in_flight.leases().items():
        try:
            kept = await worker.deliveries.extend(ids, token, lease_seconds)
        except BackendError as exc:
            log.warning("lease renewal failed: %s", exc)
            continue
        missed += [(i, token) for i in ids if i not in kept and (i, token) in in_flight]
    if missed:  # or completed meanwhile by a write that has not forgotten them yet
        with anyio.move_on_after(_WRITE_WAIT_SECONDS):
            await worker._results.between_writes()
        lost = [i for i, token in missed if (i, token) in in_flight]
        if lost:
            log.warning("leases lost for deliveries %s; their results will be refused", lost)


async def _storage_upkeep(worker: Worker) -> None:
    """The store's own upkeep turn (PostgreSQL's append-only ring)."""
    try:
        await worker.deliveries.upkeep()
    except BackendError as exc:
        log.warning("storage upkeep failed: %s", exc)


async def _recover_leases(worker: Worker) -> None:
    """Put expired leases of any worker back, finish settled backfills; wake the claims if any."""
    try:
        if await worker.deliveries.recover_expired() + await worker.deliveries.finish_backfills():
            worker.wakeups.wake_local({SWEEP})
    except BackendError as exc:
        log.warning("housekeeping failed: %s", exc)


def _rescue(bus: Bus, worker: Worker) -> list[Service]:
    """Taking back the work of lost workers every recovery interval, unless turned off."""
    after = worker.rescue_after_seconds
    if after is None:
        return []
    return [
        Periodic("worker rescue", worker.recovery_interval_seconds, lambda: _rescue_lost(bus, worker, after))
    ]


async def _rescue_lost(bus: Bus, worker: Worker, after: float) -> None:
    """One rescue pass: log and report what was taken back, and wake the claims for it."""
    try:
        rescues = await worker.deliveries.rescue(after)
    except BackendError as exc:
        log.warning("worker rescue failed: %s", exc)
        return
    if not rescues:
        return
    for r in rescues:
        log.warning(
            "took back %d deliveries of lost worker %s (%s:%s, %s, silent %.0fs)",
            r.deliveries, r.worker_id, r.hostname, r.pid, r.reason, r.silent_seconds,
            extra={"outcome": "rescued"},
        )  # fmt: skip
    bus.hooks.on_rescue(rescues)
    worker.wakeups.wake_local({SWEEP})


async def report_alive(worker: Worker, *, gone: bool = False) -> None:
    """Write this worker's row (``gone``: that it left); a failure only delays the next report."""
    served = list(worker._claims.active)
    try:
        await worker.deliveries.worker_beat(worker.id, gone=gone, subscription_ids=served)
    except BackendError as exc:
        log.debug("worker heartbeat not written: %s", exc)
        return
    worker.beat_at = time.monotonic()


# Ticks at most this often: schedules due within it share one transaction
# (10,000 schedules a minute cost a third as much as ticking for each).
_TICK_MIN_SLEEP = 0.05
_TICK_MAX_SLEEP = 1.0
_TICK_BATCH = 100


class ScheduleTicks:
    """Records the bus's schedules, then ticks them until the worker stops."""

    name = "schedule ticks"

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def run(self, stopping: Stopping) -> None:
        if not self.bus.schedules.declared:
            return
        planner = self.bus.schedules.planner()
        await self._declare(planner, stopping)
        while not stopping():
            pause = await self._tick(planner)
            await anyio.sleep(pause)

    async def _declare(self, planner: SchedulePlanner, stopping: Stopping) -> None:
        store, decls = self.bus.backend.schedules, [s.decl() for s in self.bus.schedules.declared.values()]
        while not stopping():
            try:
                await store.declare(decls, planner)
                return
            except BackendError as exc:
                log.warning("recording schedules failed (%s); retrying", exc)
                await anyio.sleep(_TICK_MAX_SLEEP)

    async def _tick(self, planner: SchedulePlanner) -> float:
        """One tick; the seconds until the next."""
        try:
            report = await self.bus.backend.schedules.tick(planner, _TICK_BATCH)
        except BackendError as exc:
            log.warning("schedule tick failed (%s); retrying", exc)
            return _TICK_MAX_SLEEP
        except Exception:  # a bug in a tick must not take the worker's handlers down with it
            log.exception("schedule tick failed; retrying")
            return _TICK_MAX_SLEEP
        if report.full:
            return 0
        due_in = _TICK_MAX_SLEEP if report.next_due_in is None else report.next_due_in
        return min(max(due_in, _TICK_MIN_SLEEP), _TICK_MAX_SLEEP)


def _retention(bus: Bus) -> list[Service]:
    """Pruning every ``bus.retention.interval``, if it has one.

    The first pass waits a random part of the interval, so workers started
    together do not all try the lock at once (the losers skip at once anyway).
    """
    if bus.retention.interval is None:
        return []
    interval = bus.retention.interval.total_seconds()
    pruner = Pruner(bus.backend.retention, bus.retention)
    first = random.uniform(0.1, 1.0) * interval
    return [Periodic("retention", interval, lambda: _prune(pruner, interval), first)]


async def _prune(pruner: Pruner, interval: float) -> None:
    """One pruning pass, logged when it removed anything."""
    try:
        report = await pruner.run()
    except BackendError as exc:
        retention_log.warning("pruning failed (next pass in %.0fs): %s", interval, exc)
        return
    if report.total:
        retention_log.info(
            "pruned %d completed and %d dead deliveries, %d events, %d schedule occurrences, "
            "%d finished workflows in %.2fs",
            report.completed_deliveries,
            report.dead_deliveries,
            report.events,
            report.occurrences,
            report.workflows,
            report.seconds,
            extra={"outcome": "pruned"},
        )
