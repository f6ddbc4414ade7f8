"""Inspection reads for a dashboard: filtered delivery lists, capped counts, an event, its chain."""

from __future__ import annotations

import uuid

import pytest

from eventbus import ConfigurationError, Context, NotFound, RetryPolicy
from eventbus.types import DeliveryFilter

from ...support.helpers import OrderPlaced, PaymentRequested, Shipped, drain

pytestmark = pytest.mark.append_only


async def _chain(bus, n: int = 4) -> None:
    """OrderPlaced -> PaymentRequested -> Shipped; the charge of o-1 always fails."""

    @bus.subscribe(OrderPlaced, name="charge", retry=RetryPolicy(max_attempts=2, base_delay_seconds=0))
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id == "o-1":
            raise RuntimeError(f"card declined for {event.order_id}")
        ctx.emit(PaymentRequested(order_id=event.order_id))

    @bus.subscribe(OrderPlaced, name="audit")
    async def audit(event: OrderPlaced, ctx: Context) -> None:
        pass

    @bus.subscribe(PaymentRequested, name="ship")
    async def ship(event: PaymentRequested, ctx: Context) -> None:
        ctx.emit(Shipped(order_id=event.order_id))

    @bus.subscribe(Shipped, name="notify")
    async def notify(event: Shipped, ctx: Context) -> None:
        pass

    await bus.publish_many([OrderPlaced(order_id=f"o-{i}", amount_cents=100 * i) for i in range(n)])
    await drain(bus)


@pytest.mark.pooler
async def test_find_filters_and_pages_newest_first(bus) -> None:
    await _chain(bus)
    everything = await bus.find_deliveries(limit=1000)
    ids = [d.id for d in everything]
    assert ids == sorted(ids, reverse=True) and len(ids) == 4 * 2 + 3 * 2
    dead = await bus.find_deliveries(DeliveryFilter(status="dead"))
    assert [(d.subscription, d.status, d.attempts) for d in dead] == [("charge", "dead", 2)]
    assert "card declined for o-1" in (dead[0].last_error or "")
    first = await bus.find_deliveries(DeliveryFilter(subscription="audit"), limit=3)
    rest = await bus.find_deliveries(DeliveryFilter(subscription="audit"), limit=3, before_id=first[-1].id)
    assert len(first) == 3 and len(rest) == 1
    assert {d.id for d in first} | {d.id for d in rest} == {
        d.id for d in everything if d.subscription == "audit"
    }
    by_type = await bus.find_deliveries(DeliveryFilter(event_type="test.shipped"))
    assert {d.subscription for d in by_type} == {"notify"} and len(by_type) == 3


async def test_find_by_payload_field_key_and_correlation(bus) -> None:
    await _chain(bus)
    hits = await bus.find_deliveries(DeliveryFilter(payload_path="amount_cents", payload_value="200"))
    assert {(d.subscription, d.event_id) for d in hits} == {("charge", 3), ("audit", 3)}
    ship = await bus.find_deliveries(DeliveryFilter(payload_path="order_id", payload_value="o-2"))
    assert {d.subscription for d in ship} == {"charge", "audit", "ship", "notify"}
    root = 3  # o-2's OrderPlaced: its chain is itself and what its handlers emitted
    chain = await bus.find_deliveries(DeliveryFilter(correlation_id=root))
    assert {d.subscription for d in chain} == {"charge", "audit", "ship", "notify"}
    assert all(d.correlation_id in (None, root) for d in chain)
    assert await bus.find_deliveries(DeliveryFilter(key="nope")) == []


async def test_count_is_capped(bus) -> None:
    await _chain(bus)
    assert await bus.count_deliveries() == 14
    assert await bus.count_deliveries(cap=5) == 6  # more than 5
    assert await bus.count_deliveries(DeliveryFilter(status="completed"), cap=100) == 13
    assert await bus.count_deliveries(DeliveryFilter(payload_path="order_id", payload_value="o-1")) == 2


async def test_event_view_has_every_delivery_with_history(bus) -> None:
    await _chain(bus, n=2)
    view = await bus.event(2)  # o-1: charge dead after two attempts, audit completed
    assert view.event_type == "test.order_placed" and b'"order_id":"o-1"' in view.payload
    by_sub = {d.subscription: d for d in view.deliveries}
    assert set(by_sub) == {"audit", "charge"}
    assert by_sub["charge"].status == "dead" and [a.attempt for a in by_sub["charge"].history] == [1, 2]
    assert "RuntimeError" in by_sub["charge"].history[0].traceback
    assert by_sub["audit"].status == "completed" and by_sub["audit"].history == []
    with pytest.raises(NotFound):
        await bus.event(999)


async def test_trace_links_causes_from_any_event_of_the_chain(bus) -> None:
    await _chain(bus, n=1)
    shipped = (await bus.find_deliveries(DeliveryFilter(subscription="notify")))[0].event_id
    root = await bus.trace(shipped)
    (paid,) = root.children
    (ship,) = paid.children
    chain = [root, paid, ship]
    assert [e.event_type for e in chain] == ["test.order_placed", "test.payment_requested", "test.shipped"]
    assert [e.causation_id for e in chain] == [None, root.id, paid.id]
    assert all(e.correlation_id == root.id for e in chain)
    assert await bus.trace(root.id) == root
    with pytest.raises(NotFound):
        await bus.trace(999)


async def test_a_filter_by_ids_keeps_only_those(bus) -> None:
    await _chain(bus, n=3)
    everything = await bus.find_deliveries(limit=1000)
    picked = sorted(d.id for d in everything)[1:4]
    found = await bus.find_deliveries(DeliveryFilter(ids=picked))
    assert sorted(d.id for d in found) == picked
    assert await bus.count_deliveries(DeliveryFilter(ids=picked)) == 3
    dead = [d.id for d in everything if d.status == "dead"]
    assert await bus.count_deliveries(DeliveryFilter(ids=picked + dead, status="dead")) == len(dead)
    assert await bus.find_deliveries(DeliveryFilter(ids=[])) == []


async def test_delivery_ids_walk_in_id_order_from_a_cursor(bus) -> None:
    await _chain(bus, n=3)
    inspect = bus.backend.inspect
    all_ids = sorted(d.id for d in await bus.find_deliveries(limit=1000))
    first = await inspect.delivery_ids(DeliveryFilter(), 4)
    rest = await inspect.delivery_ids(DeliveryFilter(), 1000, first[-1])
    assert first + rest == all_ids
    dead = await inspect.delivery_ids(DeliveryFilter(status="dead", subscription="charge"), 1000)
    assert dead == sorted(d.id for d in await bus.find_deliveries(DeliveryFilter(status="dead")))
    assert await inspect.delivery_ids(DeliveryFilter(ids=all_ids[:2], status="dead"), 10) == [
        i for i in all_ids[:2] if i in dead
    ]


async def test_bad_inspection_input_is_refused(bus) -> None:
    with pytest.raises(ConfigurationError):
        await bus.find_deliveries(DeliveryFilter(payload_path="a'; drop", payload_value="x"))
    with pytest.raises(ConfigurationError):
        await bus.find_deliveries(DeliveryFilter(payload_path="a"))
    with pytest.raises(ConfigurationError):
        await bus.find_deliveries(limit=0)


@pytest.mark.pooler
async def test_subscription_names_are_the_recorded_subscriptions_in_order(bus) -> None:
    """The dashboard's filter choices: the names of the subscription list, without its counts."""
    assert await bus.subscription_names() == []
    await _chain(bus, n=2)
    names = await bus.subscription_names()
    assert names == ["audit", "charge", "notify", "ship"]
    assert names == [s.name for s in await bus.list_subscriptions()]


@pytest.mark.pooler
async def test_workers_are_the_status_workers_without_its_counts(bus) -> None:
    """The dashboard's lease column: who holds a delivery, read without the status's counts."""
    assert await bus.workers() == []
    await _chain(bus, n=2)
    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    for worker_id in ids:
        await bus.backend.deliveries.worker_beat(worker_id)
    workers = await bus.workers()
    assert sorted(w.id for w in workers) == sorted(ids)
    listed = {w.id: (w.hostname, w.pid) for w in (await bus.status()).workers}
    assert {w.id: (w.hostname, w.pid) for w in workers} == listed


@pytest.mark.pooler
async def test_status_in_a_window_bounds_completed_and_events_and_keeps_the_backlog_exact(bus) -> None:
    """The overview's counts: completed and cancelled among the newest N deliveries, events up to N."""
    await _chain(bus)  # 14 deliveries: 13 completed, the charge of o-1 dead; 10 events
    exact = await bus.status()
    assert exact.window is None and not exact.window_full
    wide = await bus.status(window=1000)
    assert wide.rows == exact.rows and wide.events == exact.events == 10 and not wide.window_full
    narrow = await bus.status(window=3)
    assert narrow.window == 3 and narrow.window_full and narrow.events == 3
    counts = {(r.subscription, r.status): r.count for r in narrow.rows}
    assert counts[("charge", "dead")] == 1  # exact, from the dead-letter index
    assert 0 < sum(n for (_, status), n in counts.items() if status == "completed") <= 3
    assert all(q.completed_last_hour_capped and q.completed_last_hour <= 3 for q in narrow.queues)
    assert all(t.events <= 3 for t in narrow.event_types)
    assert any(t.events_capped for t in narrow.event_types)
    assert not any(q.completed_last_hour_capped for q in wide.queues)
    with pytest.raises(ConfigurationError):
        await bus.status(window=0)
