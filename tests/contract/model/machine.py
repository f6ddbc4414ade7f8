"""The state machine that drives a real bus and the model side by side (Hypothesis stateful testing).

Each rule is one step of the delivery contract on the real backend: publish
(single or batched, with and without dedup keys and ordering keys, some
delayed past the end of the run), claim (with a long lease or one that runs
out at once), complete (with a follow-up event), fail (retried at once,
retried past the end of the run, or dead), release, extend, the sweep of
expired leases, a result under a stale lease token, cancel (of pending and
of stuck deliveries), the operator's retry now and release of stuck
deliveries, replay of dead letters, and retention. Each checks what the store answered against the model, then
moves the model; the invariants compare every delivery and the counts after
every step.

Steps call the :class:`~eventbus.backends.base.DeliveryStore` port as a
worker or a pull claim does, and the :class:`~eventbus.Bus` for publishing,
cancel, retry now, release of stuck deliveries, replay and pruning. A lease
is made to run out without moving any clock: a claim or renewal with a 1 ms
lease, and the sweep a few milliseconds later. A worker is lost the same way:
claims are made by a live worker (its heartbeat taken as each run starts) or
by one that never reported, and an operator's action may call every worker
lost after 1 ms of silence.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import anyio
from anyio.from_thread import BlockingPortal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from eventbus import Bus, Envelope, Event, Retention
from eventbus.backends.base import Completion, DeliveryStore, Failure, OutgoingEvent
from eventbus.types import DeliveryFilter, DeliveryId, DeliveryRow, PublishResult, StatusReport

from .model import Delivery, Model, PublishedEvent, Sub

__all__ = ["WORKER", "DeliveryMachine", "Harness", "Item"]

T = TypeVar("T")

WORKER = "00000000-0000-4000-8000-0000000000aa"
"""A live worker: it reports as each run starts (and again when its report grows old)."""
GONE = "00000000-0000-4000-8000-0000000000bb"
"""A worker that never reported: lost from the start, whatever its leases."""
WORKERS = st.sampled_from([WORKER, WORKER, GONE])
LONG_LEASE = 60.0
SHORT_LEASE = 0.001
EXPIRED_AFTER = 0.005
"""How long after its last short lease a sweep runs, so each of them has run out by the database's clock."""
CLOCK_TICK = 0.003
"""A prune waits this long first: SQLite's clock counts milliseconds, and a prune with no retention takes
only rows that finished before its own time."""

SILENT = 0.001
"""An operator's ``lost_after_seconds`` past which every worker is lost (the machine waits it out)."""
BEAT_AGAIN = 10.0
"""The live worker reports again before an operator's action once its report is this old (lost at 30 s)."""

LATER = 3600.0
"""A delay (of a publish or a retry) that outlasts any run: the delivery stays pending and not due."""

ALL_SILENT = st.sampled_from([False, False, False, True])
"""Whether an operator's action calls every worker lost (mostly not: a live worker's live lease stays)."""
LATE_RESULTS = st.sampled_from([None, "complete", "fail", "release", "extend"])
"""What the old holder of a delivery an operator released or cancelled does next, if anything."""

KEYS = st.sampled_from([None, "k1", "k2", "k3"])
ORDERING_KEYS = st.sampled_from([None, "a", "b"])


@dataclass(frozen=True)
class Spec:
    """An event to publish: its dedup key, its ordering key, and whether it is delayed past the run."""

    key: str | None
    ordering_key: str | None
    delayed: bool = False


SPECS = st.builds(Spec, KEYS, ORDERING_KEYS, st.sampled_from([False, False, True]))


class Item(Event, event_type="model.item"):
    n: int


@dataclass
class Harness:
    """What every example of the machine shares: the bus (opened once), its loop, a way to empty it."""

    portal: BlockingPortal
    bus: Bus
    subs: tuple[Sub, ...]
    reset: Callable[[], None]
    """Delete every event, delivery and attempt (the schema and the subscriptions stay)."""
    prunes_by_row: bool = True
    """Whether retention takes completed deliveries one by one. Not on PostgreSQL's append-only
    hot path, where a completed ring delivery is a row of the outcome log, dropped with its day
    (tests/integration/test_append_only.py covers that retention)."""


class DeliveryMachine(RuleBasedStateMachine):
    harness: ClassVar[Harness]

    def __init__(self) -> None:
        super().__init__()
        self.harness.reset()
        self.model = Model(self.harness.subs)
        self.top_id = 0
        """The highest delivery id seen: new deliveries are listed above it."""
        self.n = 0
        self.short_lease_at = 0.0
        self.seen: dict[int, tuple[int, int]] = {}
        """(attempts, replays) of each delivery as the last check saw it."""
        self.handed_back: set[int] = set()
        """Deliveries released since the last check (their claim's attempt does not count)."""
        self.beat_at = 0.0
        self.beat()

    def beat(self) -> None:
        """The live worker reports (its row outlives the reset between runs)."""
        self.call(self.store.worker_beat, WORKER)
        self.beat_at = time.monotonic()

    # -- plumbing ----------------------------------------------------------------

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return self.harness.portal.call(fn, *args)

    @property
    def bus(self) -> Bus:
        return self.harness.bus

    @property
    def store(self) -> DeliveryStore:
        return self.harness.bus.backend.deliveries

    def item(self) -> Item:
        self.n += 1
        return Item(n=self.n)

    def envelope(self, spec: Spec) -> Envelope:
        delay = LATER if spec.delayed else None
        return Envelope(self.item(), key=spec.key, ordering_key=spec.ordering_key, delay=delay)

    def outgoing(self, spec: Spec) -> OutgoingEvent:
        e = self.envelope(spec)
        return self.bus.outgoing(e.event, key=e.key, ordering_key=e.ordering_key, delay=e.delay)

    def new_rows(self) -> list[DeliveryRow]:
        """Deliveries above the highest id seen, oldest first."""
        rows = self.call(lambda: self.bus.find_deliveries(after_id=self.top_id, limit=1000))
        self.top_id = max([self.top_id, *(r.id for r in rows)])
        return sorted(rows, key=lambda r: r.id)

    def add_events(self, events: list[PublishedEvent], rows: list[DeliveryRow]) -> None:
        """Learn the deliveries (``rows``) of newly published ``events``: one pending per subscription."""
        assert {r.event_id for r in rows} == {e.id for e in events}, (rows, events)
        for e in events:
            mine = [r for r in rows if r.event_id == e.id]
            assert sorted(r.subscription for r in mine) == sorted(s.name for s in self.model.subs)
            assert all(r.status == "pending" and r.attempts == 0 and r.key == e.key for r in mine)
            self.model.add_event(e, {r.subscription: r.id for r in mine})

    def expect_published(self, specs: list[Spec], results: list[PublishResult]) -> list[PublishedEvent]:
        """Check dedup by (type, key): a key held by a kept event, or earlier in the batch, is a duplicate."""
        taken: dict[str, int] = {}
        new: list[PublishedEvent] = []
        for spec, result in zip(specs, results, strict=True):
            key = spec.key
            owner = None if key is None else taken.get(key) or self.model.owner_of(key)
            assert result.duplicate == (owner is not None), (key, owner, result)
            if owner is not None:
                assert result.event_id == owner
                continue
            assert result.event_id not in self.model.events
            new.append(PublishedEvent(result.event_id, key, spec.ordering_key, spec.delayed))
            if key is not None:
                taken[key] = result.event_id
        return new

    def processing(self) -> list[Delivery]:
        return self.model.in_status("processing")

    def a_claim(self, data: st.DataObject) -> tuple[str, list[Delivery]]:
        """One live lease token and some of the deliveries claimed under it."""
        first = data.draw(st.sampled_from(self.processing()))
        assert first.token is not None
        held = [d for d in self.processing() if d.token == first.token]
        chosen = data.draw(st.lists(st.sampled_from(held), min_size=1, unique_by=lambda d: d.id))
        return first.token, chosen

    # -- publishing --------------------------------------------------------------

    @initialize(specs=st.lists(SPECS, min_size=1, max_size=6), data=st.data(), claimed=st.booleans())
    def backlog(self, specs: list[Spec], data: st.DataObject, claimed: bool) -> None:
        """Every run starts with some work, and half of them with some of it claimed."""
        self.publish(specs, batch=True)
        if claimed and self.model.in_status("pending"):
            self.claim(data, data.draw(st.integers(1, 3)), data.draw(st.booleans()), data.draw(WORKERS))

    @rule(specs=st.lists(SPECS, min_size=1, max_size=3), batch=st.booleans())
    def publish(self, specs: list[Spec], batch: bool) -> None:
        """One publish_many, or one publish per event."""
        envelopes = [self.envelope(spec) for spec in specs]
        if batch:
            results = self.call(self.bus.publish_many, envelopes)
        else:
            results = [self.call(self.publish_one, e) for e in envelopes]
        self.add_events(self.expect_published(specs, results), self.new_rows())

    async def publish_one(self, e: Envelope) -> PublishResult:
        return await self.bus.publish(e.event, key=e.key, ordering_key=e.ordering_key, delay=e.delay)

    # -- claims and their results ------------------------------------------------

    @precondition(lambda self: self.model.in_status("pending"))
    @rule(data=st.data(), limit=st.integers(1, 3), short=st.booleans(), worker=WORKERS)
    def claim(self, data: st.DataObject, limit: int, short: bool, worker: str) -> None:
        """A claim by the live worker or the lost one, with a long lease or one that runs out."""
        sub = data.draw(st.sampled_from(self.model.subs))
        claimable = self.model.claimable(sub)
        lease = SHORT_LEASE if short else LONG_LEASE
        got = self.call(self.store.claim, sub.id, limit, lease, worker, sub.ordered)
        ids = [c.id for c in got]
        assert len(set(ids)) == len(ids) == min(limit, len(claimable)), (ids, claimable)
        assert set(ids) <= claimable, f"claimed {set(ids) - claimable}, not claimable (per-key FIFO)"
        assert len({c.lease_token for c in got}) <= 1
        for c in got:
            d = self.model.deliveries[c.id]
            assert (c.event_id, c.subscription_id, c.attempts) == (d.event_id, sub.id, d.attempts + 1)
            assert c.lease_token not in {token for _, token in self.model.stale}
            self.model.claimed(d, c.lease_token, short, worker)
        if short and got:
            self.short_lease_at = time.monotonic()

    @precondition(lambda self: self.processing())
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "release", "extend"]))
    def settle(self, data: st.DataObject, how: str) -> None:
        """What a worker does with some deliveries of one claim: complete, fail, release or renew them."""
        token, chosen = self.a_claim(data)
        if how == "complete":
            self.complete(token, chosen, data.draw(st.none() | SPECS))
        elif how == "fail":
            self.fail(token, chosen, data.draw(st.sampled_from(["retry", "retry later", "dead"])))
        elif how == "release":
            self.release(token, chosen)
        else:
            self.extend(token, chosen, data.draw(st.booleans()))

    def complete(self, token: str, chosen: list[Delivery], follow_up: Spec | None) -> None:
        """Completed, the first with a follow-up event when ``follow_up`` is given."""
        extra = () if follow_up is None else (self.outgoing(follow_up),)
        completions = [
            Completion(DeliveryId(d.id), token, extra if i == 0 else ()) for i, d in enumerate(chosen)
        ]
        assert self.call(self.store.complete, completions) == {(d.id, token) for d in chosen}
        for d in chosen:
            self.model.settled(d, "completed")
        if follow_up is not None:
            self.expect_follow_up(follow_up)

    def expect_follow_up(self, spec: Spec) -> None:
        """The follow-up of a completion: a new event unless a kept event holds its key."""
        rows = self.new_rows()
        if spec.key is not None and self.model.owner_of(spec.key) is not None:
            assert rows == [], "a follow-up with a kept key was inserted"
            return
        (event_id,) = {r.event_id for r in rows}
        self.add_events([PublishedEvent(event_id, spec.key, spec.ordering_key, spec.delayed)], rows)

    def fail(self, token: str, chosen: list[Delivery], how: str) -> None:
        """Failed attempts: retried at once, retried past the end of the run, or dead."""
        dead, delay = how == "dead", LATER if how == "retry later" else 0.0
        failures = [
            Failure(DeliveryId(d.id), token, dead, delay, "Boom", "boom", "", 0.0, WORKER) for d in chosen
        ]
        assert self.call(self.store.fail, failures) == {(d.id, token) for d in chosen}
        for d in chosen:
            self.model.failed(d, dead, later=how == "retry later")

    def release(self, token: str, chosen: list[Delivery]) -> None:
        assert self.call(self.store.release, [DeliveryId(d.id) for d in chosen], token) == len(chosen)
        for d in chosen:
            self.model.released(d)
            self.handed_back.add(d.id)

    def extend(self, token: str, chosen: list[Delivery], short: bool) -> None:
        ids = [DeliveryId(d.id) for d in chosen]
        renewed = self.call(self.store.extend, ids, token, SHORT_LEASE if short else LONG_LEASE)
        assert renewed == set(ids)
        for d in chosen:
            d.short_lease = short
        if short:
            self.short_lease_at = time.monotonic()

    @precondition(lambda self: any(d.short_lease for d in self.processing()))
    @rule()
    def expire_leases(self) -> None:
        """The short leases have run out: the sweep takes exactly those back."""
        time.sleep(max(0.0, self.short_lease_at + EXPIRED_AFTER - time.monotonic()))
        expired = [d for d in self.processing() if d.short_lease]
        assert self.call(self.store.recover_expired) == len(expired)
        for d in expired:
            self.model.expired(d)

    @precondition(lambda self: self.model.stale)
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "release", "extend"]))
    def stale_result(self, data: st.DataObject, how: str) -> None:
        """Fencing: a token whose claim ended changes nothing, its follow-ups included.

        Often the token of an earlier claim of a delivery that is processing
        again under a new one: the case fencing is for; else any ended claim's
        (one an operator released or cancelled as stuck, among others).
        """
        reclaimed = [(i, t) for i, t in self.model.stale if i in {d.id for d in self.processing()}]
        pool = reclaimed if reclaimed and data.draw(st.integers(0, 3)) > 0 else self.model.stale
        delivery_id, token = data.draw(st.sampled_from(pool))
        self.refused(delivery_id, token, how)

    def refused(self, delivery_id: int, token: str, how: str) -> None:
        """A result under a token whose claim ended: ``how`` is refused and changes nothing."""
        did = DeliveryId(delivery_id)
        if how == "complete":
            follow_up = (self.outgoing(Spec(None, None)),)
            assert self.call(self.store.complete, [Completion(did, token, follow_up)]) == set()
        elif how == "fail":
            stale = Failure(did, token, True, 0.0, "Stale", "stale", "", 0.0, WORKER)
            assert self.call(self.store.fail, [stale]) == set()
        elif how == "release":
            assert self.call(self.store.release, [did], token) == 0
        else:
            assert self.call(self.store.extend, [did], token, LONG_LEASE) == set()

    # -- operations --------------------------------------------------------------

    def some_ids(self, data: st.DataObject, among: list[Delivery]) -> list[int]:
        """Up to three delivery ids, mostly of ``among`` (when any), sometimes of any state."""
        mostly = bool(among) and data.draw(st.integers(0, 2)) > 0
        ids = [d.id for d in among] if mostly else sorted(self.model.deliveries)
        return data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))

    def lost_workers(self, all_silent: bool) -> tuple[float, frozenset[str]]:
        """The ``lost_after_seconds`` of an operator's action about to run, and who is lost then.

        Every short lease has run out first. With ``all_silent`` every worker is
        lost (1 ms of silence, waited out); else only the one that never reported.
        """
        now = time.monotonic()
        if now - self.beat_at > BEAT_AGAIN:
            self.beat()
        wait_until = self.short_lease_at + EXPIRED_AFTER
        if all_silent:
            wait_until = max(wait_until, self.beat_at + EXPIRED_AFTER)
        time.sleep(max(0.0, wait_until - time.monotonic()))
        return (SILENT, frozenset({WORKER, GONE})) if all_silent else (30.0, frozenset({GONE}))

    @precondition(lambda self: self.model.in_status("pending", "processing"))
    @rule(data=st.data(), stuck=st.booleans(), all_silent=ALL_SILENT, late=LATE_RESULTS)
    def cancel(self, data: st.DataObject, stuck: bool, all_silent: bool, late: str | None) -> None:
        """Pending deliveries end cancelled, and with ``stuck`` stuck ones too: the old holder's
        result (``late``) is refused."""
        among = self.processing() if stuck else []
        chosen = self.some_ids(data, among or self.model.in_status("pending"))
        lost_after, lost = self.lost_workers(all_silent) if stuck else (30.0, frozenset())
        moved = [
            self.model.deliveries[i]
            for i in chosen
            if self.model.deliveries[i].status == "pending"
            or (stuck and self.model.stuck(self.model.deliveries[i], lost))
        ]
        tokens = [(d.id, d.token) for d in moved if d.token is not None]
        got = self.call(lambda: self.bus.cancel(chosen, stuck=stuck, lost_after_seconds=lost_after))
        assert got == len(moved), (chosen, moved)
        for d in moved:
            self.model.cancelled(d)
        if tokens and late is not None:
            self.refused(*tokens[0], late)

    @precondition(lambda self: any(not d.due for d in self.model.in_status("pending")))
    @rule(data=st.data())
    def retry_now(self, data: st.DataObject) -> None:
        """Pending deliveries waiting out a delay or a backoff become due now (and claimable when
        they head their key): by ids, or every delivery of the condition ``retrying``."""
        by_filter = bool(self.model.retrying()) and data.draw(st.booleans())
        if by_filter:
            target: list[int] | DeliveryFilter = DeliveryFilter(condition="retrying")
            moved = self.model.retrying()
            listed = self.call(lambda: self.bus.find_deliveries(DeliveryFilter(condition="retrying")))
            assert sorted(r.id for r in listed) == [d.id for d in moved]
        else:
            target = self.some_ids(data, [d for d in self.model.in_status("pending") if not d.due])
            moved = [d for i in target if (d := self.model.deliveries[i]).status == "pending" and not d.due]
        assert self.call(self.bus.retry_now, target) == len(moved), (target, moved)
        for d in moved:
            self.model.retried_now(d)

    @precondition(lambda self: self.processing())
    @rule(data=st.data(), all_silent=ALL_SILENT, late=LATE_RESULTS)
    def release_stuck(self, data: st.DataObject, all_silent: bool, late: str | None) -> None:
        """Stuck deliveries go back as a lease recovery sends them (the attempt counts, its
        history row says ``Released``); their tokens lose. By ids, or by the condition
        ``stuck`` (whose rows are the expired leases: a lost worker's live lease is not among them)."""
        lost_after, lost = self.lost_workers(all_silent)
        if data.draw(st.integers(0, 3)) == 0:
            target: list[int] | DeliveryFilter = DeliveryFilter(condition="stuck")
            moved = [d for d in self.processing() if d.short_lease]
        else:
            target = self.some_ids(data, self.processing())
            moved = [d for i in target if self.model.stuck(d := self.model.deliveries[i], lost)]
        holders = [(d.token, d.worker) for d in moved]
        got = self.call(lambda: self.bus.release_stuck(target, lost_after_seconds=lost_after))
        assert got == len(moved), (target, moved)
        for d in moved:
            self.model.released_stuck(d)
        if moved:
            d = moved[0]
            detail = self.call(self.bus.delivery, d.id)
            assert (detail.status, detail.attempts) == (d.status, d.attempts)
            assert detail.last_error == "Released: released by an operator"
            assert len(detail.history) == d.failures
            last = detail.history[-1]
            assert (last.attempt, last.error_type, last.worker_id) == (d.attempts, "Released", holders[0][1])
            token = holders[0][0]
            if late is not None and token is not None:
                self.refused(d.id, token, late)

    @precondition(lambda self: self.model.in_status("dead"))
    @rule(data=st.data(), by_subscription=st.booleans())
    def replay(self, data: st.DataObject, by_subscription: bool) -> None:
        """Dead letters start over (pending, no attempts), their history and replay count kept."""
        if by_subscription:
            sub = data.draw(st.sampled_from(self.model.subs))
            flt = DeliveryFilter(subscription=sub.name)
            dead = [d for d in self.model.in_status("dead") if d.sub == sub]
            listed = self.call(lambda: self.bus.dead_letters(subscription=sub.name))
            assert [r.id for r in listed] == [d.id for d in dead]
        else:
            ids = sorted(self.model.deliveries)
            chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
            flt = DeliveryFilter(ids=chosen)
            dead = [d for d in self.model.in_status("dead") if d.id in chosen]
        assert self.call(self.bus.replay, flt) == len(dead)
        for d in dead:
            self.model.replayed(d)
            detail = self.call(self.bus.delivery, d.id)
            assert (detail.status, detail.attempts, detail.replays) == ("pending", 0, d.replays)
            assert len(detail.history) == d.failures

    @precondition(lambda self: self.harness.prunes_by_row and any(self.model.prunable(dedup_window=False)))
    @rule(
        dedup_window=st.booleans(),
        dead_retention=st.sampled_from([None, timedelta(days=1)]),
        batch_size=st.sampled_from([2, 1000]),
    )
    def prune(self, dedup_window: bool, dead_retention: timedelta | None, batch_size: int) -> None:
        """Retention with no completed retention: finished work goes, never pending, processing or dead."""
        retention = Retention(
            completed_retention=timedelta(0),
            dead_retention=dead_retention,
            dedup_window=timedelta(days=1) if dedup_window else timedelta(0),
            batch_size=batch_size,
        )
        deliveries, events = self.model.prunable(dedup_window)
        time.sleep(CLOCK_TICK)
        report = self.call(lambda: self.bus.prune(retention=retention))
        assert (report.completed_deliveries, report.dead_deliveries) == (len(deliveries), 0)
        assert report.events == len(events)
        self.model.pruned(deliveries, events)

    # -- invariants --------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        """Every delivery (status, attempts, replays), the status counts, the number of events,
        and when each subscription's next claimable delivery is due."""
        rows, report, next_runs = self.call(self.read_store)
        rows_by_id: dict[int, DeliveryRow] = {r.id: r for r in rows}
        assert set(rows_by_id) == set(self.model.deliveries), "deliveries appeared or disappeared"
        for i, d in self.model.deliveries.items():
            r = rows_by_id[i]
            assert (r.event_id, r.subscription, r.status) == (d.event_id, d.sub.name, d.status), (r, d)
            assert (r.attempts, r.replays) == (d.attempts, d.replays), (r, d)
            was_attempts, was_replays = self.seen.get(i, (0, 0))
            if r.replays == was_replays and i not in self.handed_back:
                assert r.attempts >= was_attempts, f"delivery {i}: attempts went down"
        self.seen = {i: (r.attempts, r.replays) for i, r in rows_by_id.items()}
        self.handed_back.clear()
        counts = {(r.subscription, r.status): r.count for r in report.rows if r.count}
        assert counts == dict(self.model.counts())
        assert report.events == len(self.model.events)
        for sub in self.model.subs:
            self.check_next_run(sub, next_runs[sub.name])

    def check_next_run(self, sub: Sub, seconds: float | None) -> None:
        """A worker waits as ``next_run_in`` says: it must see every delivery a claim could take."""
        due = self.model.next_due(sub)
        assert (seconds is None) == (due is None), (sub.name, seconds, due)
        if seconds is not None:
            assert (seconds <= 0) == due, (sub.name, seconds, due)

    async def read_store(self) -> tuple[list[DeliveryRow], StatusReport, dict[str, float | None]]:
        """The reads of the check, at once."""
        found: dict[str, Any] = {}

        async def read(name: str, fn: Callable[[], Awaitable[Any]]) -> None:
            found[name] = await fn()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "rows", lambda: self.bus.find_deliveries(limit=1000))
            tg.start_soon(read, "status", self.bus.backend.inspect.status)
            for sub in self.model.subs:
                tg.start_soon(read, sub.name, lambda sub=sub: self.store.next_run_in(sub.id))
        return found["rows"], found["status"], {sub.name: found[sub.name] for sub in self.model.subs}
