"""The worker: claim deliveries, run handlers, write results.

One anyio task group per worker. The claim loop (``_claims``) takes batches
per subscription while there is capacity and feeds ``concurrency``
long-lived runners through a dispatch queue (``_queue``); each runner
executes one delivery at a time outside any transaction (``_execute``, where
the observability hooks wrap the handler); one writer batches the results
(``_results``): completions with their follow-up events in one transaction,
fenced by the lease token. A transactional handler runs inside the
transaction that completes its delivery (``_transact``). Beside them run the
LISTEN connection and the upkeep services (``_upkeep``): lease renewal,
expired-lease recovery, liveness, schedule ticks and retention. ``_inflight`` is the one registry of
claimed runs.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ..backends.base import ClaimedDelivery, Completion, DeliveryStore, Failure, Wakeups
from ..errors import (
    BackendError,
    ConfigurationError,
    HandlerInterrupted,
    ResultNotStored,
)
from ..observe import DeliveryTracker
from ..router import Subscription
from ..throughput import COMPLETED, DEAD, FAILED, Rollup
from ._claims import ClaimLoop
from ._execute import Executor
from ._health import Phase, WorkerHealth, health, serve_health
from ._results import ResultWriter
from ._shield import Shield
from ._transact import TransactionalRunner
from ._upkeep import BEAT_SECONDS, flush_rollup, report_alive, upkeep_services

if TYPE_CHECKING:
    from ..bus import Bus

__all__ = ["Worker", "WorkerHealth", "serve_health"]

log = logging.getLogger("eventbus.worker")


_MAX_CONCURRENCY = 10_000
"""The most handlers a worker runs at once: each is a task started up front, so more would never start."""


def _check_settings(bus: Bus, names: Sequence[str] | None, counts: dict[str, int], **seconds: float) -> None:
    """Refuse settings that would busy-loop, never run or serve nothing, with the reason."""
    for name, count in counts.items():
        if count < 1:
            raise ConfigurationError(f"{name} must be at least 1, got {count}")
    if counts["concurrency"] > _MAX_CONCURRENCY:
        too_many = counts["concurrency"]
        raise ConfigurationError(f"concurrency must be at most {_MAX_CONCURRENCY:,}, got {too_many}")
    for name, interval in seconds.items():
        zero_ok = name == "grace_seconds"
        if not math.isfinite(interval) or interval < 0 or (interval == 0 and not zero_ok):
            least = "zero or more" if zero_ok else "more than zero"
            raise ConfigurationError(f"{name} must be a finite number of seconds, {least}; got {interval}")
    unknown = sorted(set(names or ()) - set(bus.subscriptions))
    if unknown:
        known = ", ".join(sorted(bus.subscriptions)) or "none"
        raise ConfigurationError(f"no subscription named {', '.join(unknown)} in this bus (it has: {known})")


RESCUE_AFTER_SECONDS = 15.0
"""A worker silent for three heartbeats is lost (see ``Worker(rescue_after_seconds=…)``)."""


def _checked_rescue(seconds: float | None) -> float | None:
    if seconds is not None and not (math.isfinite(seconds) and seconds >= 2 * BEAT_SECONDS):
        raise ConfigurationError(
            f"rescue_after_seconds must be at least {2 * BEAT_SECONDS:g} (two heartbeats) or None, "
            f"got {seconds}"
        )
    return seconds


class Worker:
    """Runs the handlers of a bus's subscriptions.

    :param concurrency: handlers running at once (at most 10,000). Twice ``batch_size`` lets the
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
    :param rescue_after_seconds: a worker whose heartbeat (written about every
        five seconds by a task of its own, with the database's clock) is older
        than this is taken for lost, and its processing deliveries go back to
        pending without waiting for their leases; so is a worker of this host
        whose process is gone. At least 10 (two heartbeats); None turns it off
        (then only leases bring dead workers' work back). A worker whose event
        loop is blocked for this long (a handler doing CPU work without
        ``anyio.to_thread``) writes no heartbeat and is taken for lost too:
        its deliveries run again elsewhere, and its own results are refused.
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
        rescue_after_seconds: float | None = RESCUE_AFTER_SECONDS,
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
        self.rescue_after_seconds = _checked_rescue(rescue_after_seconds)
        self.names = list(subscriptions) if subscriptions else None
        self.id = str(uuid.uuid4())
        self._stopping = False
        self.phase: Phase = "starting"
        """``starting``, ``serving``, ``stopping`` (draining after :meth:`stop`) or ``stopped``."""
        self.beat_at: float | None = None
        """When (monotonic) this worker's heartbeat last reached the database."""
        self._grace_over = False  # running handlers outlived the grace period
        self._loop_scope: anyio.CancelScope | None = None
        self._handler_scope: anyio.CancelScope | None = None
        self._shield = Shield()
        self._tracker = DeliveryTracker(bus.hooks, self.id)
        self.rollup = Rollup() if bus.rollup else None
        """This worker's counts per subscription and minute, until flushed (None: ``Bus(rollup=False)``)."""
        self._claims = self._claim_loop()
        self._results = ResultWriter(
            self.deliveries, self.wakeups, self._claims.forget, self._unstorable, self._shield
        )
        self._results.tracker = self._tracker
        self._executor = Executor(bus, self.id, self._tracker)
        self._transactional = TransactionalRunner(self.deliveries, self._executor, self._results.settled)

    def _claim_loop(self) -> ClaimLoop:
        return ClaimLoop(
            self.deliveries,
            self.wakeups,
            worker_id=self.id,
            concurrency=self.concurrency,
            batch_size=self.batch_size,
            poll_interval_seconds=self.poll_interval_seconds,
            burst=self.burst,
            shield=self._shield,
            tracker=self._tracker,
            stopping=lambda: self._stopping,
        )

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
        if self.phase == "serving":
            self.phase = "stopping"
        if self._loop_scope is not None:
            self._loop_scope.cancel()
        if now:
            self.grace_seconds = 0
            self._shield.abort()
            if self._handler_scope is not None:
                self._handler_scope.cancel()

    def health(self) -> WorkerHealth:
        """This worker's liveness and readiness (see :mod:`eventbus.worker._health`); no I/O."""
        return health(self)

    async def run(self) -> None:
        """Serve until :meth:`stop` (or, in burst mode, until nothing is runnable)."""
        try:
            await self._run()
        finally:
            self.phase = "stopped"

    async def _run(self) -> None:
        await self._register()
        if not self._stopping:
            self.phase = "serving"
        async with anyio.create_task_group() as services:
            if not self.burst:
                services.start_soon(self.wakeups.run, name="wake-up listener")
            for service in upkeep_services(self.bus, self):
                services.start_soon(service.run, lambda: self._stopping, name=service.name)
            services.start_soon(self._results.run, name="result writer")
            await self._serve()
            with self._shield():
                await self._results.flush_all()
                if self.rollup is not None:
                    await flush_rollup(self.bus.backend.rollup, self.rollup, everything=True)
                if not self.burst:
                    await report_alive(self, gone=True)
            self._shield.abort(0)  # nothing else is worth waiting for
            services.cancel_scope.cancel()

    async def _serve(self) -> None:
        """Claim and run until stopped; hand back what did not start; give the rest the grace period."""
        async with anyio.create_task_group() as handlers:
            self._handler_scope = handlers.cancel_scope
            for _ in range(self.concurrency):
                handlers.start_soon(self._runner)
            with anyio.CancelScope() as self._loop_scope:
                if self._stopping:
                    self._loop_scope.cancel()
                await self._claims.run()
            with self._shield():
                await self._claims.release_unstarted()
            finished = await self._wait_for_handlers(self.grace_seconds)
            self._grace_over = not finished and not self._shield.aborted
            handlers.cancel_scope.cancel()

    async def _register(self) -> None:
        subs = [
            s
            for s in self.bus.subscriptions.values()
            if s.handler is not None and (self.names is None or s.name in self.names)
        ]  # a subscription without a handler is pulled (bus.pull.claim), never pushed
        ids = await self.bus.register([s.name for s in subs], served=True)
        self._claims.serve(subs, ids)
        served = {s.name for s in subs}
        await self.bus.workflows.record_definitions(
            [m for m in self.bus.workflows.machines if f"wf.{m}" in served]
        )

    # -- running one delivery ------------------------------------------------------

    async def _runner(self) -> None:
        """One of ``concurrency`` long-lived tasks that run handlers one at a time.

        Cheaper than a task per delivery; the queue never holds more than the
        free capacity, because claims ask for no more than that.
        """
        queue, ran = self._claims.queue, 0
        while True:
            sub, delivery = await queue.get()
            await self._handle(sub, delivery)
            ran += 1
            if ran % 32 == 0:  # handlers that never await must not starve the loop
                await anyio.lowlevel.checkpoint()

    async def _handle(self, sub: Subscription, delivery: ClaimedDelivery) -> None:
        started = time.monotonic()
        result: Completion | Failure | None
        try:
            # The handler's result for the result writer (None: already written in its
            # own transaction); called here, not through a helper: this runs per delivery.
            if sub.transactional:
                result = await self._transactional.run(sub, delivery, started)
            else:
                result = await self._executor.invoke(sub, delivery, started)
        except anyio.get_cancelled_exc_class():
            if self._grace_over:  # cut off after the grace period: that counts as an attempt
                self._results.add(self._interrupted(sub, delivery, started))
            else:
                with self._shield():
                    await self._release(delivery)
            raise
        finally:
            self._claims.slots.free()
        if self.rollup is not None:
            self._count(sub, result, started)
        if result is None:  # a transactional handler's completion, committed with its writes
            return
        if isinstance(result, Failure) and not result.dead:
            self._claims.wake.within(result.retry_delay_seconds)
        self._results.add(result)

    def _count(self, sub: Subscription, result: Completion | Failure | None, started: float) -> None:
        """The run in this worker's rollup: its outcome and handler time."""
        assert self.rollup is not None
        if result is None or isinstance(result, Completion):
            outcome = COMPLETED
        else:
            outcome = DEAD if result.dead else FAILED
        self.rollup.add(sub.name, outcome, time.monotonic() - started)

    def _interrupted(self, sub: Subscription, delivery: ClaimedDelivery, started: float) -> Failure:
        grace = f"{self.grace_seconds:g}s"
        exc = HandlerInterrupted(f"handler still running when the worker's grace period of {grace} ended")
        return self._executor.failure(sub, delivery, exc, started)

    def _unstorable(self, result: Completion | Failure, exc: Exception) -> Failure | None:
        """The failed attempt recorded in place of a result the database refused.

        None (give up: the lease will expire) when the run is no longer held
        or the result already was such a replacement.
        """
        claim = self._claims.in_flight.get(result.lease)
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
        self._claims.in_flight.discard((delivery.id, delivery.lease_token))
        try:
            await self.deliveries.release([delivery.id], delivery.lease_token)
        except BackendError as exc:
            log.warning("could not release delivery %s (its lease will): %s", delivery.id, exc)

    async def _wait_for_handlers(self, grace_seconds: float) -> bool:
        """Wait up to ``grace_seconds`` for running handlers; False if some are still running."""
        with anyio.move_on_after(grace_seconds):
            await self._claims.slots.wait_until_idle()
        return self._claims.slots.running == 0
