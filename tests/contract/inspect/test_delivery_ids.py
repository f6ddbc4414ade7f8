"""The delivery filter's ``ids`` and the id walk behind bulk replay, purge and cancel."""

from __future__ import annotations

from eventbus import Context, RetryPolicy
from eventbus.types import DeliveryFilter

from ...support.helpers import OrderPlaced, drain


async def _dead_and_done(bus, n: int = 6) -> None:
    """``n`` orders: ``charge`` fails every one dead, ``audit`` completes them all."""

    @bus.subscribe(OrderPlaced, name="charge", retry=RetryPolicy(max_attempts=1))
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        raise RuntimeError("declined")

    @bus.subscribe(OrderPlaced, name="audit")
    async def audit(event: OrderPlaced, ctx: Context) -> None:
        pass

    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(n)])
    await drain(bus)


async def test_find_and_count_keep_only_the_ids_named(bus) -> None:
    await _dead_and_done(bus)
    everything = await bus.find_deliveries(limit=100)
    chosen = [everything[0].id, everything[3].id, everything[5].id]
    found = await bus.find_deliveries(DeliveryFilter(ids=chosen))
    assert [d.id for d in found] == sorted(chosen, reverse=True)
    assert await bus.count_deliveries(DeliveryFilter(ids=chosen)) == 3
    dead = [d.id for d in everything if d.status == "dead"][:2]
    both = DeliveryFilter(ids=[*dead, *chosen], status="dead")
    assert {d.id for d in await bus.find_deliveries(both)} == {
        d.id for d in everything if d.id in {*dead, *chosen} and d.status == "dead"
    }
    assert await bus.count_deliveries(DeliveryFilter(ids=[])) == 0


async def test_delivery_ids_walk_in_id_order_from_the_cursor(bus) -> None:
    await _dead_and_done(bus)
    inspect = bus.backend.inspect
    dead = sorted(d.id for d in await bus.find_deliveries(DeliveryFilter(status="dead"), limit=100))
    assert len(dead) == 6
    walked, after = [], 0
    while batch := await inspect.delivery_ids(DeliveryFilter(status="dead", subscription="charge"), 4, after):
        assert batch == sorted(batch) and len(batch) <= 4
        walked += batch
        after = batch[-1]
    assert walked == dead
    assert await inspect.delivery_ids(DeliveryFilter(status="dead", subscription="audit"), 10) == []
    assert await inspect.delivery_ids(DeliveryFilter(status="dead", ids=dead[1:3]), 10) == dead[1:3]
    assert await inspect.delivery_ids(DeliveryFilter(status="dead"), 10, dead[-2]) == dead[-1:]
    done = await inspect.delivery_ids(DeliveryFilter(status="completed", event_type="test.order_placed"), 100)
    audit = sorted(d.id for d in await bus.find_deliveries(DeliveryFilter(subscription="audit"), limit=100))
    assert done == audit
    every = await inspect.delivery_ids(DeliveryFilter(), 100)
    assert every == sorted([*dead, *audit])
