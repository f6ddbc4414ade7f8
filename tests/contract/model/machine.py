"""The state machine that drives a real bus and the model side by side (Hypothesis stateful testing).

Each rule is one step of the delivery contract on the real backend: publish
(single or batched, with and without dedup keys and ordering keys, some
delayed past the end of the run), claim (with a long lease or one that runs
out at once), complete (with a follow-up event), fail (retried at once,
retried past the end of the run, or dead), release, extend, the sweep of
expired leases, a result under a stale lease token, cancel, replay of dead
letters, and retention. Each checks what the store answered against the model, then
moves the model; the invariants compare every delivery and the counts after
every step.

Steps call the :class:`~eventbus.backends.base.DeliveryStore` port as a
worker or a pull claim does, and the :class:`~eventbus.Bus` for publishing,
cancel, replay and pruning. A lease is made to run out without moving any
clock: a claim or renewal with a 1 ms lease, and the sweep a few
milliseconds later.
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
LONG_LEASE = 60.0
SHORT_LEASE = 0.001
EXPIRED_AFTER = 0.005
"""How long after its last short lease a sweep runs, so each of them has run out by the database's clock."""
CLOCK_TICK = 0.003
"""A prune waits this long first: SQLite's clock counts milliseconds, and a prune with no retention takes
only rows that finished before its own time."""

LATER = 3600.0
"""A delay (of a publish or a retry) that outlasts any run: the delivery stays pending and not due."""

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

    @initialize(specs=st.lists(SPECS, min_size=1, max_size=6))
    def backlog(self, specs: list[Spec]) -> None:
        """Every run starts with some work."""
        self.publish(specs, batch=True)

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
    @rule(data=st.data(), limit=st.integers(1, 3), short=st.booleans())
    def claim(self, data: st.DataObject, limit: int, short: bool) -> None:
        sub = data.draw(st.sampled_from(self.model.subs))
        claimable = self.model.claimable(sub)
        lease = SHORT_LEASE if short else LONG_LEASE
        got = self.call(self.store.claim, sub.id, limit, lease, WORKER, sub.ordered)
        ids = [c.id for c in got]
        assert len(set(ids)) == len(ids) == min(limit, len(claimable)), (ids, claimable)
        assert set(ids) <= claimable, f"claimed {set(ids) - claimable}, not claimable (per-key FIFO)"
        assert len({c.lease_token for c in got}) <= 1
        for c in got:
            d = self.model.deliveries[c.id]
            assert (c.event_id, c.subscription_id, c.attempts) == (d.event_id, sub.id, d.attempts + 1)
            assert c.lease_token not in {token for _, token in self.model.stale}
            self.model.claimed(d, c.lease_token, short)
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

        Mostly the token of an earlier claim of a delivery that is processing
        again under a new one: the case fencing is for.
        """
        reclaimed = [(i, t) for i, t in self.model.stale if i in {d.id for d in self.processing()}]
        delivery_id, token = data.draw(st.sampled_from(reclaimed or self.model.stale))
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

    @precondition(lambda self: self.model.in_status("pending"))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ids = sorted(self.model.deliveries)
        chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
        pending = [self.model.deliveries[i] for i in chosen if self.model.deliveries[i].status == "pending"]
        assert self.call(self.bus.cancel, chosen) == len(pending)
        for d in pending:
            d.status = "cancelled"

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

    @precondition(lambda self: any(self.model.prunable(dedup_window=False)))
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
