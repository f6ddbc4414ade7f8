"""The claim loop: batches per subscription while there is capacity, handed to the runners.

Each subscription the worker serves is an :class:`_Active` with its claim
cursor and the spacing of its claims from the start of the pending index.
The loop claims one batch per subscription that may have more, puts every
claimed delivery on the runners' dispatch queue, and when nothing is known to
be runnable waits for a wake-up, the slow poll, or the earliest time it
planned to look again (:class:`WakePlan`: the next due row, a retry, a full
claim put off).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..backends._spacing import Spaced
from ..backends._wakeup import SWEEP
from ..backends.base import ClaimedDelivery, DeliveryStore, LeaseKey, Wakeups
from ..errors import BackendError
from ..observe import DeliveryTracker
from ..router import Subscription
from ..types import DeliveryId
from ._inflight import InFlight
from ._queue import DispatchQueue
from ._shield import Shield

__all__ = ["FULL_SCAN_EVERY", "ClaimLoop", "Slots", "WakePlan"]

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


class Slots:
    """The worker's capacity: deliveries claimed and not yet finished, out of ``size``.

    One task waits at a time (the claim loop, then the stop). A freed slot
    wakes it only once as many are free as it waits for: a claim loop waiting
    for half the slots is woken once per claim, not once per delivery.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.running = 0
        self._freed = anyio.Event()
        self._wake_at = math.inf
        """Free slots at which the waiting task is woken (none waits: never)."""

    def take(self) -> None:
        self.running += 1

    def free(self) -> None:
        self.running -= 1
        if self.size - self.running >= self._wake_at:
            self._wake_at = math.inf
            self._freed.set()

    async def wait_for(self, threshold: int) -> int:
        """Wait until at least ``threshold`` slots are free; return how many are."""
        await self._wait(threshold)
        return self.size - self.running

    async def wait_until_idle(self) -> None:
        """Wait until no delivery is running (callers bound it with a timeout)."""
        await self._wait(self.size)

    async def _wait(self, free: int) -> None:
        try:
            while self.size - self.running < free:
                self._freed, self._wake_at = anyio.Event(), free
                await self._freed.wait()
        finally:
            self._wake_at = math.inf


class WakePlan:
    """The one time the claim loop looks again without being woken: the earliest asked for."""

    def __init__(self) -> None:
        self.at = math.inf

    def within(self, seconds: float) -> None:
        """Look again at the latest ``seconds`` from now."""
        self.at = min(self.at, time.monotonic() + max(seconds, 0.0))

    def timeout(self, poll_seconds: float) -> float:
        """How long a wait for work may last: until the plan, or the slow poll."""
        return min(poll_seconds, max(self.at - time.monotonic(), 0.0))

    def is_due(self) -> bool:
        return time.monotonic() >= self.at

    def clear(self) -> None:
        self.at = math.inf


class ClaimLoop:
    """Claims deliveries for the subscriptions served and queues them for the runners.

    Capacity is counted in ``slots``: a claim asks for no more than is free, so
    the dispatch ``queue`` never holds more than the runners can start. Every
    claim is held in ``in_flight`` until its result is written or refused
    (:meth:`forget`) or it is handed back (:meth:`release_unstarted`).
    """

    def __init__(
        self,
        deliveries: DeliveryStore,
        wakeups: Wakeups,
        *,
        worker_id: str,
        concurrency: int,
        batch_size: int,
        poll_interval_seconds: float,
        burst: bool,
        shield: Shield,
        tracker: DeliveryTracker,
        stopping: Callable[[], bool],
    ) -> None:
        self.deliveries, self.wakeups, self.worker_id = deliveries, wakeups, worker_id
        self.batch_size, self.burst = batch_size, burst
        self.poll_interval_seconds = poll_interval_seconds
        self.shield, self.tracker, self.stopping = shield, tracker, stopping
        self.slots = Slots(concurrency)
        self.in_flight = InFlight()
        self.queue: DispatchQueue[tuple[Subscription, ClaimedDelivery]] = DispatchQueue()
        self.wake = WakePlan()
        self.active: dict[int, _Active] = {}
        self._by_type: dict[str, list[int]] = {}
        self.turned_at = time.monotonic()
        """When the loop last took a turn (claimed, waited out a poll or retried a failure)."""

    def serve(self, subs: Iterable[Subscription], ids: dict[str, int]) -> None:
        """Take on ``subs``, registered under ``ids`` (their database ids by name)."""
        for sub in subs:
            active = _Active(sub, ids[sub.name])
            self.active[active.id] = active
            self._by_type.setdefault(sub.event_type, []).append(active.id)

    async def run(self) -> None:
        """Claim until stopping (or, in burst mode, until nothing is runnable)."""
        dirty: set[int] | None = set(self.active)
        failures = 0
        while dirty is not None and not self.stopping():
            self.turned_at = time.monotonic()
            try:
                dirty = await self._step(dirty)
                failures = 0
            except BackendError as exc:
                failures += 1
                log.warning("claiming failed (%s); retrying", exc)
                await anyio.sleep(min(5.0, 0.05 * 2**failures))
                dirty = set(self.active)

    async def _step(self, dirty: set[int]) -> set[int] | None:
        """One turn of the claim loop; None when a burst run is done."""
        if dirty:
            return await self._claim_round(dirty)
        if not self.burst:
            return await self._wait_for_work()
        await self._settle()
        await self.deliveries.recover_expired()
        for active in self.active.values():  # the last round looks behind every cursor
            active.full_scan.due_at = -math.inf
        dirty = await self._claim_round(set(self.active))
        if not dirty and self.slots.running == 0 and not self.in_flight:
            return None
        return dirty

    async def _claim_round(self, dirty: set[int]) -> set[int]:
        """Claim one batch per subscription; return those that may have more."""
        still: set[int] = set()
        threshold = max(1, min(self.batch_size, self.slots.size) // 2)
        for sub_id in sorted(dirty):
            free = await self.slots.wait_for(threshold)
            if self.stopping():  # checked before every claim: a backlog never postpones a stop
                break
            active = self.active[sub_id]
            limit = min(self.batch_size, free)
            with self.shield():  # a claim is never lost to a graceful stop
                batch = await self._claim(active, limit)
            self._start(active, batch)
            if len(batch) == limit:
                still.add(sub_id)
            elif not self.burst:
                await self._note_next_run(active)
        return still

    async def _claim(self, active: _Active, limit: int) -> list[ClaimedDelivery]:
        """Claim from the cursor, topped up by a claim from the start when that is due.

        The cursor (the last row claimed) saves walking index entries of rows
        already taken. A claim from the start finds what became pending behind
        it (a publish that committed late, a recovered lease); how often one is
        made follows its cost (see ``FULL_SCAN_EVERY``).
        """
        sub = active.sub
        started = time.monotonic()
        after = active.cursor if started < active.full_scan.due_at else None
        batch = await self.deliveries.claim(
            active.id, limit, sub.lease_seconds, self.worker_id, sub.ordered, after=after
        )
        if after is None:
            active.full_scan_ran(started, time.monotonic())
        elif len(batch) < limit and started >= active.full_scan.allowed_at:
            full_started = time.monotonic()
            batch += await self.deliveries.claim(
                active.id, limit - len(batch), sub.lease_seconds, self.worker_id, sub.ordered
            )
            active.full_scan_ran(full_started, time.monotonic())
        elif len(batch) < limit:
            active.look_behind = True
        self.tracker.claimed(sub.name, batch, time.monotonic() - started)
        if batch and batch[-1].position is not None and not sub.ordered:
            active.cursor = max(batch[-1].position, active.cursor or batch[-1].position)
        return batch

    async def _note_next_run(self, active: _Active) -> None:
        """Plan the next claim from the next claimable row's due time.

        The backend counts only rows a claim could take: for an ordered
        subscription whose keys are all busy there is none, and the loop waits
        for a completion (:meth:`forget`), a wake-up or the slow poll instead
        of claiming again at once.
        """
        delay = await self.deliveries.next_run_in(active.id, active.cursor)
        if active.look_behind:  # come back for the claim from the start that was put off
            behind = active.full_scan.allowed_at - time.monotonic()
            delay = behind if delay is None else min(delay, behind)
        if delay is not None:
            self.wake.within(delay)

    async def _wait_for_work(self) -> set[int]:
        """Wait for a wake-up, the planned time or the slow poll; return what to claim for."""
        woken = await self.wakeups.wait(self.wake.timeout(self.poll_interval_seconds))
        if not woken or SWEEP in woken or self.wake.is_due():
            self.wake.clear()
            return set(self.active)
        return {sub_id for t in woken for sub_id in self._by_type.get(t, ())}

    def _start(self, active: _Active, batch: list[ClaimedDelivery]) -> None:
        sub = active.sub
        for delivery in batch:
            self.in_flight.add(sub, delivery)
            self.slots.take()
            self.queue.put((sub, delivery))

    async def _settle(self) -> None:
        """Burst mode: wait until every handler finished and its result is written."""
        while self.slots.running or self.in_flight:  # noqa: ASYNC110 (burst mode only)
            await anyio.sleep(0.002)

    def forget(self, lease: LeaseKey) -> None:
        """A result was written (or refused): this run leaves the worker.

        An ordered subscription whose keys were all busy waits for exactly this
        (see :meth:`_note_next_run`), so its claim loop is woken.
        """
        claim = self.in_flight.pop(lease)
        if claim is not None and claim.sub.ordered and claim.delivery.ordering_key is not None:
            self.wakeups.wake_local({claim.sub.event_type})

    async def release_unstarted(self) -> None:
        """On stop: hand back claimed deliveries no runner has started yet."""
        by_token: dict[str, list[DeliveryId]] = {}
        for _sub, delivery in self.queue.take_all():
            by_token.setdefault(delivery.lease_token, []).append(delivery.id)
            self.in_flight.discard((delivery.id, delivery.lease_token))
            self.slots.free()
        for token, ids in by_token.items():
            try:
                await self.deliveries.release(ids, token)
            except BackendError as exc:
                log.warning("could not release %d deliveries (their leases will): %s", len(ids), exc)
