"""The worker: claim deliveries, run handlers, write results.

One anyio task group per worker. The claim loop (here) takes batches per
subscription while there is capacity and feeds ``concurrency`` long-lived
runners through a dispatch queue (``_queue``); each runner executes one
delivery at a time outside any transaction (``_execute``, where the
observability hooks wrap the handler); one writer batches the results
(``_results``): completions with their follow-up events in one transaction,
fenced by the lease token. Beside them run the LISTEN connection, the lease
heartbeat, expired-lease recovery, schedule ticks (``_schedules``) and
retention (``_retention``); ``_inflight`` is the one registry of claimed runs.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from ..backends._spacing import Spaced
from ..backends._wakeup import SWEEP
from ..backends.base import ClaimedDelivery, Completion, DeliveryStore, Failure, LeaseKey, Wakeups
from ..errors import (
    BackendError,
    ConfigurationError,
    HandlerInterrupted,
    ResultNotStored,
)
from ..observe import DeliveryTracker
from ..router import Subscription
from ..types import DeliveryId
from ._execute import Executor
from ._inflight import InFlight
from ._queue import DispatchQueue
from ._results import ResultWriter
from ._retention import run_retention
from ._schedules import run_schedules
from ._shield import Shield

if TYPE_CHECKING:
    from ..bus import Bus

__all__ = ["Worker"]

log = logging.getLogger("eventbus.worker")


# A claim from the start of the pending index (a "full" claim) finds rows that
# became pending behind the cursor. Full claims are spaced by their cost
# (backends/_spacing.py): at least every second, and after a short cursor
# claim while they cost a few milliseconds; as rarely as their cost demands
# while a held xmin horizon keeps dead entries in the index.
FULL_SCAN_EVERY = 1.0


@dataclass
class _Active:
    """A subscription this worker serves, with its database id and claim cursor."""

    sub: Subscription
    id: int
    cursor: Any = None
    # due: a full claim instead of a cursor claim; allowed: a short cursor claim is topped up
    full_scan: Spaced = field(default_factory=lambda: Spaced(FULL_SCAN_EVERY))
    look_behind: bool = False  # a short cursor claim put its full claim off

    def full_scan_ran(self, started: float, ended: float) -> None:
        self.look_behind = False
        self.full_scan.ran(started, ended)


def _check_settings(bus: Bus, names: Sequence[str] | None, counts: dict[str, int], **seconds: float) -> None:
    """Refuse settings that would busy-loop, never run or serve nothing, with the reason."""
    for name, count in counts.items():
        if count < 1:
            raise ConfigurationError(f"{name} must be at least 1, got {count}")
    for name, interval in seconds.items():
        zero_ok = name == "grace_seconds"
        if not math.isfinite(interval) or interval < 0 or (interval == 0 and not zero_ok):
            least = "zero or more" if zero_ok else "more than zero"
            raise ConfigurationError(f"{name} must be a finite number of seconds, {least}; got {interval}")
    unknown = sorted(set(names or ()) - set(bus.subscriptions))
    if unknown:
        known = ", ".join(sorted(bus.subscriptions)) or "none"
        raise ConfigurationError(f"no subscription named {', '.join(unknown)} in this bus (it has: {known})")


class Worker:
    """Runs the handlers of a bus's subscriptions.

    :param concurrency: handlers running at once. Twice ``batch_size`` lets the
        next batch be claimed while the last one runs.
    :param batch_size: deliveries claimed per round trip.
    :param poll_interval_seconds: the slow poll that covers lost notifications.
    :param burst: process until nothing is runnable, then return (drain mode).
    :param grace_seconds: how long running handlers may finish after :meth:`stop`;
        a handler still running then is cancelled and that run counts as a
        failed attempt (:class:`~eventbus.HandlerInterrupted`), so a hung
        handler reaches the dead-letter queue across restarts.
    :param subscriptions: names to serve (default: all of the bus).
    :param recovery_interval_seconds: how often this worker looks for expired
        leases of any worker (dead workers' deliveries are retried within about
        their lease plus this interval).
    """

    def __init__(
        self,
        bus: Bus,
        *,
        concurrency: int = 200,
        batch_size: int = 100,
        poll_interval_seconds: float = 5.0,
        burst: bool = False,
        grace_seconds: float = 10.0,
        subscriptions: Sequence[str] | None = None,
        recovery_interval_seconds: float = 1.0,
    ) -> None:
        _check_settings(
            bus,
            subscriptions,
            {"concurrency": concurrency, "batch_size": batch_size},
            poll_interval_seconds=poll_interval_seconds,
            grace_seconds=grace_seconds,
            recovery_interval_seconds=recovery_interval_seconds,
        )
        self.bus = bus
        self.deliveries: DeliveryStore = bus.backend.deliveries
        self.wakeups: Wakeups = bus.backend.wakeups
        self.concurrency = max(1, concurrency)
        self.batch_size = max(1, batch_size)
        self.poll_interval_seconds = poll_interval_seconds
        self.burst = burst
        self.grace_seconds = grace_seconds
        self.recovery_interval_seconds = recovery_interval_seconds
        self.names = list(subscriptions) if subscriptions else None
        self.id = str(uuid.uuid4())
        self._active: dict[int, _Active] = {}
        self._by_type: dict[str, list[int]] = {}
        self._in_flight = InFlight()
        self._running = 0
        self._shield = Shield()
        self._results = ResultWriter(
            self.deliveries, self.wakeups, self._forget, self._unstorable, self._shield
        )
        self._tracker = self._results.tracker = DeliveryTracker(bus.hooks, self.id)
        self._executor = Executor(bus, self.id, self._tracker)
        self._slot_freed = anyio.Event()
        self._stopping = False
        self._grace_over = False  # running handlers outlived the grace period
        self._loop_scope: anyio.CancelScope | None = None
        self._handler_scope: anyio.CancelScope | None = None
        self._wake_at = math.inf
        self._queue: DispatchQueue[tuple[Subscription, ClaimedDelivery]] = DispatchQueue()

    @property
    def processed(self) -> int:
        """Deliveries this worker completed (their completion committed)."""
        return self._results.processed

    # -- control -----------------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming at once; running handlers get the grace period.

        With ``now``, cancel running handlers too and give the database about
        half a second for what is left to write (handing back, results): a
        database that does not answer cannot hold the stop, and the leases of
        whatever stays unwritten cover it.
        """
        self._stopping = True
        if self._loop_scope is not None:
            self._loop_scope.cancel()
        if now:
            self.grace_seconds = 0
            self._shield.abort()
            if self._handler_scope is not None:
                self._handler_scope.cancel()

    async def run(self) -> None:
        """Serve until :meth:`stop` (or, in burst mode, until nothing is runnable)."""
        await self._register()
        async with anyio.create_task_group() as services:
            if not self.burst:
                services.start_soon(self._listen)
                services.start_soon(self._housekeeping)
                services.start_soon(run_schedules, self.bus, lambda: self._stopping)
                services.start_soon(run_retention, self.bus)
            services.start_soon(self._results.run)
            services.start_soon(self._heartbeat)
            async with anyio.create_task_group() as handlers:
                self._handler_scope = handlers.cancel_scope
                for _ in range(self.concurrency):
                    handlers.start_soon(self._runner)
                with anyio.CancelScope() as self._loop_scope:
                    if self._stopping:
                        self._loop_scope.cancel()
                    await self._claim_loop()
                with self._shield():
                    await self._release_unstarted()
                finished = await self._wait_for_handlers(self.grace_seconds)
                self._grace_over = not finished and not self._shield.aborted
                handlers.cancel_scope.cancel()
            with self._shield():
                await self._results.flush_all()
                if not self.burst:
                    await self._beat(gone=True)
            self._shield.abort(0)  # nothing else is worth waiting for
            services.cancel_scope.cancel()

    async def _register(self) -> None:
        subs = [s for s in self.bus.subscriptions.values() if self.names is None or s.name in self.names]
        ids = await self.bus.register([s.name for s in subs], served=True)
        for sub in subs:
            active = _Active(sub, ids[sub.name])
            self._active[active.id] = active
            self._by_type.setdefault(sub.event_type, []).append(active.id)

    # -- claiming --------------------------------------------------------------

    async def _claim_loop(self) -> None:
        dirty: set[int] | None = set(self._active)
        failures = 0
        while dirty is not None and not self._stopping:
            try:
                dirty = await self._step(dirty)
                failures = 0
            except BackendError as exc:
                failures += 1
                log.warning("claiming failed (%s); retrying", exc)
                await anyio.sleep(min(5.0, 0.05 * 2**failures))
                dirty = set(self._active)

    async def _step(self, dirty: set[int]) -> set[int] | None:
        """One turn of the claim loop; None when a burst run is done."""
        if dirty:
            return await self._claim_round(dirty)
        if not self.burst:
            return await self._wait_for_work()
        await self._settle()
        await self.deliveries.recover_expired()
        for active in self._active.values():  # the last round looks behind every cursor
            active.full_scan.due_at = -math.inf
        dirty = await self._claim_round(set(self._active))
        if not dirty and self._running == 0 and not self._in_flight:
            return None
        return dirty

    async def _claim_round(self, dirty: set[int]) -> set[int]:
        """Claim one batch per subscription; return those that may have more."""
        still: set[int] = set()
        for sub_id in sorted(dirty):
            free = await self._wait_for_capacity()
            if self._stopping:  # checked before every claim: a backlog never postpones a stop
                break
            active = self._active[sub_id]
            limit = min(self.batch_size, free)
            with self._shield():  # a claim is never lost to a graceful stop
                batch = await self._claim(active, limit)
            self._start(active, batch)
            if len(batch) == limit:
                still.add(sub_id)
            elif not self.burst:
                await self._note_next_run(sub_id)
        return still

    async def _claim(self, active: _Active, limit: int) -> list[ClaimedDelivery]:
        """Claim from the cursor, topped up by a claim from the start when that is due.

        The cursor (the last row claimed) saves walking index entries of rows
        already taken. A claim from the start finds what became pending behind
        it (a publish that committed late, a recovered lease); how often one is
        made follows its cost (see ``FULL_SCAN_SHARE``).
        """
        sub = active.sub
        started = time.monotonic()
        after = active.cursor if started < active.full_scan.due_at else None
        batch = await self.deliveries.claim(
            active.id, limit, sub.lease_seconds, self.id, sub.ordered, after=after
        )
        if after is None:
            active.full_scan_ran(started, time.monotonic())
        elif len(batch) < limit and started >= active.full_scan.allowed_at:
            full_started = time.monotonic()
            batch += await self.deliveries.claim(
                active.id, limit - len(batch), sub.lease_seconds, self.id, sub.ordered
            )
            active.full_scan_ran(full_started, time.monotonic())
        elif len(batch) < limit:
            active.look_behind = True
        self._tracker.claimed(sub.name, batch, time.monotonic() - started)
        if batch and batch[-1].position is not None and not sub.ordered:
            active.cursor = max(batch[-1].position, active.cursor or batch[-1].position)
        return batch

    async def _wait_for_capacity(self) -> int:
        threshold = max(1, min(self.batch_size, self.concurrency) // 2)
        while self.concurrency - self._running < threshold:
            self._slot_freed = anyio.Event()
            await self._slot_freed.wait()
        return self.concurrency - self._running

    async def _note_next_run(self, sub_id: int) -> None:
        """Plan the next claim from the next claimable row's due time.

        The backend counts only rows a claim could take: for an ordered
        subscription whose keys are all busy there is none, and the loop waits
        for a completion (:meth:`_forget`), a wake-up or the slow poll instead
        of claiming again at once.
        """
        active = self._active[sub_id]
        delay = await self.deliveries.next_run_in(sub_id, active.cursor)
        if active.look_behind:  # come back for the claim from the start that was put off
            behind = active.full_scan.allowed_at - time.monotonic()
            delay = behind if delay is None else min(delay, behind)
        if delay is not None:
            self._wake_at = min(self._wake_at, time.monotonic() + max(delay, 0.0))

    async def _wait_for_work(self) -> set[int]:
        now = time.monotonic()
        timeout = min(self.poll_interval_seconds, max(self._wake_at - now, 0.0))
        woken = await self.wakeups.wait(timeout)
        if not woken or SWEEP in woken or time.monotonic() >= self._wake_at:
            self._wake_at = math.inf
            return set(self._active)
        return {sub_id for t in woken for sub_id in self._by_type.get(t, ())}

    def _start(self, active: _Active, batch: list[ClaimedDelivery]) -> None:
        sub = active.sub
        for delivery in batch:
            self._in_flight.add(sub, delivery)
            self._running += 1
            self._queue.put((active.sub, delivery))

    def _forget(self, lease: LeaseKey) -> None:
        """A result was written (or refused): this run leaves the worker.

        An ordered subscription whose keys were all busy waits for exactly this
        (see :meth:`_note_next_run`), so its claim loop is woken.
        """
        claim = self._in_flight.pop(lease)
        if claim is not None and claim.sub.ordered and claim.delivery.ordering_key is not None:
            self.wakeups.wake_local({claim.sub.event_type})

    async def _runner(self) -> None:
        """One of ``concurrency`` long-lived tasks that run handlers one at a time.

        Cheaper than a task per delivery; the queue never holds more than the
        free capacity, because claims ask for no more than that.
        """
        ran = 0
        while True:
            sub, delivery = await self._queue.get()
            await self._handle(sub, delivery)
            ran += 1
            if ran % 32 == 0:  # handlers that never await must not starve the loop
                await anyio.lowlevel.checkpoint()

    async def _release_unstarted(self) -> None:
        """On stop: hand back claimed deliveries no runner has started yet."""
        by_token: dict[str, list[DeliveryId]] = {}
        for _sub, delivery in self._queue.take_all():
            by_token.setdefault(delivery.lease_token, []).append(delivery.id)
            self._in_flight.discard((delivery.id, delivery.lease_token))
            self._running -= 1
        for token, ids in by_token.items():
            try:
                await self.deliveries.release(ids, token)
            except BackendError as exc:
                log.warning("could not release %d deliveries (their leases will): %s", len(ids), exc)

    # -- running one delivery ------------------------------------------------------

    async def _handle(self, sub: Subscription, delivery: ClaimedDelivery) -> None:
        started = time.monotonic()
        try:
            result = await self._executor.invoke(sub, delivery, started)
        except anyio.get_cancelled_exc_class():
            if self._grace_over:  # cut off after the grace period: that counts as an attempt
                self._results.add(self._interrupted(sub, delivery, started))
            else:
                with self._shield():
                    await self._release(delivery)
            raise
        finally:
            self._running -= 1
            self._slot_freed.set()
        if isinstance(result, Failure) and not result.dead:
            self._wake_at = min(self._wake_at, time.monotonic() + result.retry_delay_seconds)
        self._results.add(result)

    def _interrupted(self, sub: Subscription, delivery: ClaimedDelivery, started: float) -> Failure:
        grace = f"{self.grace_seconds:g}s"
        exc = HandlerInterrupted(f"handler still running when the worker's grace period of {grace} ended")
        return self._executor.failure(sub, delivery, exc, started)

    def _unstorable(self, result: Completion | Failure, exc: Exception) -> Failure | None:
        """The failed attempt recorded in place of a result the database refused.

        None (give up: the lease will expire) when the run is no longer held
        or the result already was such a replacement.
        """
        claim = self._in_flight.get(result.lease)
        if claim is None or (
            isinstance(result, Failure) and result.error_type == ResultNotStored.__qualname__
        ):
            return None
        what = "completion" if isinstance(result, Completion) else "failure"
        error = ResultNotStored(f"the database refused this run's {what}: {type(exc).__name__}: {exc}")
        started = time.monotonic() - (result.duration_seconds if isinstance(result, Failure) else 0.0)
        return self._executor.failure(claim.sub, claim.delivery, error, started)

    async def _release(self, delivery: ClaimedDelivery) -> None:
        """Hand a delivery back without counting the attempt (shutdown)."""
        self._in_flight.discard((delivery.id, delivery.lease_token))
        try:
            await self.deliveries.release([delivery.id], delivery.lease_token)
        except BackendError as exc:
            log.warning("could not release delivery %s (its lease will): %s", delivery.id, exc)

    async def _wait_for_handlers(self, grace_seconds: float) -> bool:
        """Wait up to ``grace_seconds`` for running handlers; False if some are still running."""
        with anyio.move_on_after(grace_seconds):
            while self._running:
                self._slot_freed = anyio.Event()
                await self._slot_freed.wait()
        return self._running == 0

    async def _settle(self) -> None:
        """Burst mode: wait until every handler finished and its result is written."""
        while self._running or self._in_flight:  # noqa: ASYNC110 (burst mode only)
            await anyio.sleep(0.002)

    # -- leases, recovery, wake-ups --------------------------------------------------

    async def _heartbeat(self) -> None:
        leases = [a.sub.lease_seconds for a in self._active.values()] or [30.0]
        while True:
            await anyio.sleep(min(leases) / 3)
            for (token, lease_seconds), ids in self._in_flight.leases().items():
                try:
                    kept = await self.deliveries.extend(ids, token, lease_seconds)
                except BackendError as exc:
                    log.warning("lease renewal failed: %s", exc)
                    continue
                lost = [i for i in ids if i not in kept and (i, token) in self._in_flight]
                if lost:
                    log.warning("leases lost for deliveries %s; their results will be refused", lost)

    async def _housekeeping(self) -> None:
        """Recover expired leases often (a cheap partial-index probe); report in less often."""
        beat_every = max(1, round(5.0 / self.recovery_interval_seconds))
        for turn in itertools.count():
            try:
                if await self.deliveries.recover_expired() + await self.deliveries.finish_backfills():
                    self.wakeups.wake_local({SWEEP})
                if turn % beat_every == 0:
                    await self._beat()
            except BackendError as exc:
                log.warning("housekeeping failed: %s", exc)
            await anyio.sleep(self.recovery_interval_seconds)

    async def _beat(self, *, gone: bool = False) -> None:
        try:
            await self.deliveries.worker_beat(self.id, gone=gone, subscription_ids=list(self._active))
        except BackendError as exc:
            log.debug("worker heartbeat not written: %s", exc)

    async def _listen(self) -> None:
        await self.wakeups.run()
