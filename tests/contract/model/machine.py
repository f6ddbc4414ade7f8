"""The state machine that drives a real bus and the model side by side (Hypothesis stateful testing).

Each rule is one step of the delivery contract on the real backend: publish
(single or batched, with and without keys and ordering keys), claim (with a
long lease or one that runs out at once), complete (with a follow-up event),
fail (retried or dead), release, extend, the sweep of expired leases, a
result under a stale lease token, cancel, replay of dead letters, and
retention. Each checks what the store answered against the model, then
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

from anyio.from_thread import BlockingPortal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eventbus import Bus, Envelope, Event, Retention
from eventbus.backends.base import Completion, DeliveryStore, Failure, OutgoingEvent
from eventbus.types import DeliveryFilter, DeliveryId, DeliveryRow, PublishResult

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

KEYS = st.sampled_from([None, "k1", "k2", "k3"])
ORDERING_KEYS = st.sampled_from([None, "a", "b"])
ITEMS = st.lists(st.tuples(KEYS, ORDERING_KEYS), min_size=1, max_size=3)


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

    def outgoing(self, key: str | None, ordering_key: str | None) -> OutgoingEvent:
        return self.bus.outgoing(self.item(), key=key, ordering_key=ordering_key)

    def new_rows(self) -> list[DeliveryRow]:
        """Deliveries above the highest id seen, oldest first."""
        rows = self.call(lambda: self.bus.find_deliveries(after_id=self.top_id, limit=1000))
        self.top_id = max([self.top_id, *(r.id for r in rows)])
        return sorted(rows, key=lambda r: r.id)

    def add_events(self, events: list[PublishedEvent], rows: list[DeliveryRow]) -> None:
        """Learn the deliveries of newly published ``events`` (``rows``): one pending per subscription each."""
        assert {r.event_id for r in rows} == {e.id for e in events}, (rows, events)
        for e in events:
            mine = [r for r in rows if r.event_id == e.id]
            assert sorted(r.subscription for r in mine) == sorted(s.name for s in self.model.subs)
            assert all(r.status == "pending" and r.attempts == 0 and r.key == e.key for r in mine)
            self.model.add_event(e, {r.subscription: r.id for r in mine})

    def expect_published(
        self, items: list[tuple[str | None, str | None]], results: list[PublishResult]
    ) -> list[PublishedEvent]:
        """Check dedup by (type, key): a key held by a kept event, or earlier in the batch, is a duplicate."""
        taken: dict[str, int] = {}
        new: list[PublishedEvent] = []
        for (key, ordering_key), result in zip(items, results, strict=True):
            owner = None if key is None else taken.get(key) or self.model.owner_of(key)
            assert result.duplicate == (owner is not None), (key, owner, result)
            if owner is not None:
                assert result.event_id == owner
                continue
            assert result.event_id not in self.model.events
            new.append(PublishedEvent(result.event_id, key, ordering_key))
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

    @rule(items=ITEMS, batch=st.booleans())
    def publish(self, items: list[tuple[str | None, str | None]], batch: bool) -> None:
        """One publish_many, or one publish per event."""
        envelopes = [Envelope(self.item(), key=key, ordering_key=ordering_key) for key, ordering_key in items]
        if batch:
            results = self.call(self.bus.publish_many, envelopes)
        else:
            results = [self.call(lambda e=e: self.bus.publish(e.event, key=e.key, ordering_key=e.ordering_key))
                       for e in envelopes]
        self.add_events(self.expect_published(items, results), self.new_rows())

    # -- claims and their results ------------------------------------------------

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
    @rule(data=st.data(), follow_up=st.none() | st.tuples(KEYS, ORDERING_KEYS))
    def complete(self, data: st.DataObject, follow_up: tuple[str | None, str | None] | None) -> None:
        token, chosen = self.a_claim(data)
        extra = () if follow_up is None else (self.outgoing(*follow_up),)
        completions = [Completion(DeliveryId(d.id), token, extra if i == 0 else ()) for i, d in enumerate(chosen)]
        done = self.call(self.store.complete, completions)
        assert done == {(d.id, token) for d in chosen}
        for d in chosen:
            self.model.settled(d, "completed")
        if follow_up is not None:
            self.expect_follow_up(*follow_up)

    def expect_follow_up(self, key: str | None, ordering_key: str | None) -> None:
        """The follow-up of a completion: a new event unless a kept event holds its key."""
        rows = self.new_rows()
        if key is not None and self.model.owner_of(key) is not None:
            assert rows == [], "a follow-up with a kept key was inserted"
            return
        (event_id,) = {r.event_id for r in rows}
        self.add_events([PublishedEvent(event_id, key, ordering_key)], rows)

    @precondition(lambda self: self.processing())
    @rule(data=st.data(), dead=st.booleans())
    def fail(self, data: st.DataObject, dead: bool) -> None:
        chosen = data.draw(st.lists(st.sampled_from(self.processing()), min_size=1, max_size=2, unique_by=lambda d: d.id))
        failures = [_failure(d, dead) for d in chosen]
        assert self.call(self.store.fail, failures) == {(d.id, d.token) for d in chosen}
        for d in chosen:
            self.model.failed(d, dead)

    @precondition(lambda self: self.processing())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        token, chosen = self.a_claim(data)
        assert self.call(self.store.release, [DeliveryId(d.id) for d in chosen], token) == len(chosen)
        for d in chosen:
            self.model.released(d)
            self.handed_back.add(d.id)

    @precondition(lambda self: self.processing())
    @rule(data=st.data(), short=st.booleans())
    def extend(self, data: st.DataObject, short: bool) -> None:
        token, chosen = self.a_claim(data)
        ids = [DeliveryId(d.id) for d in chosen]
        renewed = self.call(self.store.extend, ids, token, SHORT_LEASE if short else LONG_LEASE)
        assert renewed == set(ids)
        for d in chosen:
            d.short_lease = short
        if short:
            self.short_lease_at = time.monotonic()

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
        """Fencing: a token whose claim ended changes nothing, its follow-ups included."""
        delivery_id, token = data.draw(st.sampled_from(self.model.stale))
        did = DeliveryId(delivery_id)
        if how == "complete":
            follow_up = (self.outgoing(None, None),)
            assert self.call(self.store.complete, [Completion(did, token, follow_up)]) == set()
        elif how == "fail":
            stale = Failure(did, token, True, 0.0, "Stale", "stale", "", 0.0, WORKER)
            assert self.call(self.store.fail, [stale]) == set()
        elif how == "release":
            assert self.call(self.store.release, [did], token) == 0
        else:
            assert self.call(self.store.extend, [did], token, LONG_LEASE) == set()

    # -- operations --------------------------------------------------------------

    @precondition(lambda self: self.model.deliveries)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ids = sorted(self.model.deliveries)
        chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
        pending = [self.model.deliveries[i] for i in chosen if self.model.deliveries[i].status == "pending"]
        assert self.call(self.bus.cancel, chosen) == len(pending)
        for d in pending:
            d.status = "cancelled"

    @rule(data=st.data(), by_subscription=st.booleans())
    def replay(self, data: st.DataObject, by_subscription: bool) -> None:
        """Dead letters start over (pending, no attempts), their history and replay count kept."""
        if by_subscription:
            sub = data.draw(st.sampled_from(self.model.subs))
            flt = DeliveryFilter(subscription=sub.name)
            dead = [d for d in self.model.in_status("dead") if d.sub == sub]
        else:
            ids = sorted(self.model.deliveries) or [0]
            chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
            flt = DeliveryFilter(ids=chosen)
            dead = [d for d in self.model.in_status("dead") if d.id in chosen]
        assert self.call(self.bus.replay, flt) == len(dead)
        for d in dead:
            self.model.replayed(d)
            detail = self.call(self.bus.delivery, d.id)
            assert (detail.status, detail.attempts, detail.replays) == ("pending", 0, d.replays)
            assert len(detail.history) == d.failures

    @rule(
        dedup_window=st.booleans(),
        dead_retention=st.sampled_from([None, timedelta(days=1)]),
        batch_size=st.sampled_from([1, 2, 1000]),
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
    def every_delivery_matches(self) -> None:
        rows = {r.id: r for r in self.call(lambda: self.bus.find_deliveries(limit=1000))}
        assert set(rows) == set(self.model.deliveries), "deliveries appeared or disappeared"
        for i, d in self.model.deliveries.items():
            r = rows[i]
            assert (r.event_id, r.subscription, r.status) == (d.event_id, d.sub.name, d.status), (r, d)
            assert (r.attempts, r.replays) == (d.attempts, d.replays), (r, d)
            was_attempts, was_replays = self.seen.get(i, (0, 0))
            if r.replays == was_replays and i not in self.handed_back:
                assert r.attempts >= was_attempts, f"delivery {i}: attempts went down"
        self.seen = {i: (r.attempts, r.replays) for i, r in rows.items()}
        self.handed_back.clear()

    @invariant()
    def counts_match(self) -> None:
        report = self.call(self.bus.backend.inspect.status)
        counts = {(r.subscription, r.status): r.count for r in report.rows if r.count}
        assert counts == dict(self.model.counts())
        assert report.events == len(self.model.events)


def _failure(d: Delivery, dead: bool) -> Failure:
    assert d.token is not None
    return Failure(DeliveryId(d.id), d.token, dead, 0.0, "Boom", "boom", "", 0.0, WORKER)
