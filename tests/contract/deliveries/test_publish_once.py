"""Keys kept for good: ``publish(..., once=True)`` and ``ctx.emit(once=True)`` outlive the dedup window."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest

from eventbus import Bus, ConfigurationError, Context, Envelope, NotFound
from eventbus.retention import Retention
from eventbus.types import PublishResult

from ...support.helpers import OrderPlaced, PaymentRequested, drain

PAST_THE_WINDOW = Retention(completed_retention=timedelta(0), dedup_window=timedelta(0))


def _subscribe(bus: Bus) -> list[str]:
    seen: list[str] = []

    @bus.subscribe(OrderPlaced, name="orders")
    async def orders(event: OrderPlaced, ctx: Context) -> None:
        seen.append(event.order_id)

    return seen


async def test_a_kept_key_holds_after_its_event_is_pruned(bus: Bus) -> None:
    seen = _subscribe(bus)
    await bus.register()
    first = await bus.publish(OrderPlaced(order_id="v-1"), key="v-1", once=True)
    plain = await bus.publish(OrderPlaced(order_id="v-2"), key="v-2")
    await drain(bus)
    assert (await bus.prune(retention=PAST_THE_WINDOW)).events == 2
    with pytest.raises(NotFound):
        await bus.trace(first.event_id)
    again = await bus.publish(OrderPlaced(order_id="v-1"), key="v-1", once=True)
    assert again == PublishResult(first.event_id, duplicate=True), "the pruned event still holds its key"
    fresh = await bus.publish(OrderPlaced(order_id="v-2"), key="v-2", once=True)
    assert not fresh.duplicate and fresh.event_id != plain.event_id, "a plain key went with its event"
    await drain(bus)
    assert seen == ["v-1", "v-2", "v-2"]


async def test_once_keeps_a_key_an_earlier_plain_publish_took(bus: Bus) -> None:
    _subscribe(bus)
    await bus.register()
    first = await bus.publish(OrderPlaced(order_id="v-3"), key="v-3")
    kept = await bus.publish(OrderPlaced(order_id="v-3"), key="v-3", once=True)
    assert kept == PublishResult(first.event_id, duplicate=True)
    await drain(bus)
    await bus.prune(retention=PAST_THE_WINDOW)
    assert await bus.publish(OrderPlaced(order_id="v-3"), key="v-3", once=True) == kept


@pytest.mark.pooler
async def test_concurrent_publishes_once_insert_one_event(bus: Bus, make_bus) -> None:
    _subscribe(bus)
    other = await make_bus()
    await bus.register()
    results: list[PublishResult] = []

    async def one(b: Bus) -> None:
        results.append(await b.publish(OrderPlaced(order_id="v-4"), key="v-4", once=True))

    async with anyio.create_task_group() as tg:
        for b in [bus, other] * 5:
            tg.start_soon(one, b)
    assert sorted(r.duplicate for r in results) == [False] + [True] * 9
    assert len({r.event_id for r in results}) == 1
    await drain(bus)
    await bus.prune(retention=PAST_THE_WINDOW)
    assert (await other.publish(OrderPlaced(order_id="v-4"), key="v-4", once=True)).duplicate


async def test_a_follow_up_emitted_once_is_never_emitted_again(bus: Bus) -> None:
    paid: list[str] = []

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        ctx.emit(PaymentRequested(order_id=event.order_id), key=f"pay:{event.order_id}", once=True)

    @bus.subscribe(PaymentRequested, name="pay")
    async def pay(event: PaymentRequested, ctx: Context) -> None:
        paid.append(event.order_id)

    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    await bus.prune(retention=PAST_THE_WINDOW)
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert paid == ["o-1"], "the second charge's follow-up was a duplicate of the pruned first one"


async def test_a_batch_mixes_kept_keys_plain_keys_and_repeats(bus: Bus) -> None:
    _subscribe(bus)
    await bus.register()
    earlier = await bus.publish(OrderPlaced(order_id="k-1"), key="k-1", once=True)
    await drain(bus)
    await bus.prune(retention=PAST_THE_WINDOW)
    results = await bus.publish_many(
        [
            Envelope(OrderPlaced(order_id="k-1"), key="k-1", once=True),  # kept, its event pruned
            Envelope(OrderPlaced(order_id="k-2"), key="k-2", once=True),  # new
            Envelope(OrderPlaced(order_id="k-2"), key="k-2", once=True),  # repeated in the batch
            Envelope(OrderPlaced(order_id="p-1"), key="p-1"),  # a plain key
            OrderPlaced(order_id="no-key"),
        ]
    )
    assert results[0] == PublishResult(earlier.event_id, duplicate=True)
    assert not results[1].duplicate and results[2] == PublishResult(results[1].event_id, duplicate=True)
    assert not results[3].duplicate and not results[4].duplicate
    await drain(bus)
    await bus.prune(retention=PAST_THE_WINDOW)
    again = await bus.publish_many(
        [
            Envelope(OrderPlaced(order_id="k-2"), key="k-2", once=True),
            Envelope(OrderPlaced(order_id="p-1"), key="p-1", once=True),
        ]
    )
    assert again[0] == PublishResult(results[1].event_id, duplicate=True)
    assert not again[1].duplicate, "the plain key went with its event"


async def test_once_needs_a_key(bus: Bus) -> None:
    with pytest.raises(ConfigurationError, match="key"):
        await bus.publish(OrderPlaced(order_id="o-1"), once=True)
