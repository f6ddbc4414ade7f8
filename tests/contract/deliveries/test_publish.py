"""Publishing: ids, idempotency keys, batches, limits, fan-out on publish."""

from __future__ import annotations

import pytest

from eventbus import Context, Envelope, PayloadTooLarge

from ...support.helpers import OrderPlaced, PaymentRequested, counts, drain

# Through PgBouncer too: a lone publish goes on the held connection with a transaction-local lock wait.
pytestmark = pytest.mark.pooler


async def test_publish_returns_id_and_dedupes_by_key(bus) -> None:
    first = await bus.publish(OrderPlaced(order_id="o-1"), key="o-1")
    again = await bus.publish(OrderPlaced(order_id="o-1", amount_cents=5), key="o-1")
    other_type = await bus.publish(PaymentRequested(order_id="o-1"), key="o-1")
    unkeyed = [await bus.publish(OrderPlaced(order_id="x")) for _ in range(2)]
    assert not first.duplicate
    assert again.duplicate and again.event_id == first.event_id
    assert not other_type.duplicate and other_type.event_id != first.event_id
    assert unkeyed[0].event_id != unkeyed[1].event_id
    assert (await bus.status()).events == 4


async def test_publish_many_keeps_order_and_dedupes(bus) -> None:
    before = await bus.publish(OrderPlaced(order_id="k1"), key="k1")
    results = await bus.publish_many(
        [
            Envelope(OrderPlaced(order_id="a")),
            Envelope(OrderPlaced(order_id="k1"), key="k1"),
            OrderPlaced(order_id="b"),
            Envelope(OrderPlaced(order_id="k2"), key="k2"),
            Envelope(OrderPlaced(order_id="k2"), key="k2"),
        ]
    )
    assert [r.duplicate for r in results] == [False, True, False, False, True]
    assert results[1].event_id == before.event_id
    assert results[3].event_id == results[4].event_id
    assert len({r.event_id for r in results}) == 4
    assert (await bus.status()).events == 4


async def test_oversize_payload_is_refused_and_nothing_stored(make_bus) -> None:
    bus = await make_bus(max_payload_bytes=64)
    with pytest.raises(PayloadTooLarge):
        await bus.publish(OrderPlaced(order_id="x" * 100))
    with pytest.raises(PayloadTooLarge):
        await bus.publish_many([OrderPlaced(order_id="ok"), OrderPlaced(order_id="x" * 100)])
    assert (await bus.status()).events == 0


async def test_fan_out_one_delivery_per_subscription(bus) -> None:
    ran: list[str] = []
    for name in ("a", "b", "c"):
        bus.subscribe(OrderPlaced, name=name)(_recorder(ran, name))
    await drain(bus)  # registers the subscriptions
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert sorted(ran) == ["a", "b", "c"]
    c = await counts(bus)
    assert c == {("a", "completed"): 1, ("b", "completed"): 1, ("c", "completed"): 1}


def _recorder(ran: list[str], name: str):
    async def handler(event: OrderPlaced, ctx: Context) -> None:
        ran.append(name)

    return handler


async def test_event_without_subscribers_stays_in_log(bus) -> None:
    await bus.publish(PaymentRequested(order_id="lonely"))
    report = await bus.status()
    assert report.events == 1 and report.rows == []
