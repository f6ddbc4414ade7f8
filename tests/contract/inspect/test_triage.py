"""Triage by cause: dead letters and failing deliveries grouped by normalised error, filtered by
error and payload text, and the groups' filters matching exactly their deliveries in the database."""

from __future__ import annotations

from eventbus import Context, RetryPolicy
from eventbus.triage import error_groups, failing
from eventbus.types import DeliveryFilter

from ...support.helpers import OrderPlaced, PaymentRequested, drain

DEAD = DeliveryFilter(status="dead")


async def _failures(bus) -> None:
    """``charge`` kills 3 orders as missing and 2 as declined; ``pay`` waits to retry 2; 1 is unrun."""

    @bus.subscribe(OrderPlaced, name="charge", retry=RetryPolicy(max_attempts=1))
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        n = event.amount_cents
        if event.order_id.startswith("gone"):
            raise LookupError(f"order {n} not found")
        raise RuntimeError(f"card 'c-{n}' declined")

    @bus.subscribe(PaymentRequested, name="pay", retry=RetryPolicy(max_attempts=5, base_delay_seconds=3600))
    async def pay(event: PaymentRequested, ctx: Context) -> None:
        raise TimeoutError(f"gateway timed out after {len(event.order_id)}s")

    orders = [OrderPlaced(order_id=f"gone-{i}", amount_cents=100 + i) for i in range(3)]
    orders += [OrderPlaced(order_id=f"vip-{i}", amount_cents=7 + i) for i in range(2)]
    await bus.publish_many(orders)
    await bus.publish_many([PaymentRequested(order_id=f"p-{i}") for i in range(2)])
    await drain(bus, wait_for_scheduled=False)
    await bus.publish(PaymentRequested(order_id="fresh"))


async def test_dead_and_failing_deliveries_grouped_by_normalised_error(bus) -> None:
    await _failures(bus)
    found = await error_groups(bus, DEAD)
    assert not found.capped and found.scanned == 5
    shown = [(g.subscription, g.error_type, g.message, g.count) for g in found.groups]
    assert shown == [
        ("charge", "LookupError", "LookupError: order <n> not found", 3),
        ("charge", "RuntimeError", "RuntimeError: card <str> declined", 2),
    ]
    for g in found.groups:
        members = await bus.find_deliveries(g.filter)
        assert len(members) == g.count and g.example_id == max(m.id for m in members)
        assert g.first_seen <= g.last_seen and g.example == members[0].last_error
    capped = await error_groups(bus, DEAD, sample=2)
    assert capped.capped and capped.scanned == 2 and sum(g.count for g in capped.groups) == 2
    await _failing_deliveries_are_those_waiting_to_retry(bus)


async def _failing_deliveries_are_those_waiting_to_retry(bus) -> None:
    found = await error_groups(bus, failing(DeliveryFilter()))
    assert [(g.subscription, g.message, g.count) for g in found.groups] == [
        ("pay", "TimeoutError: gateway timed out after <n>s", 2)
    ]
    assert await bus.count_deliveries(DeliveryFilter(status="pending", subscription="pay")) == 3
    assert await bus.cancel([d.id for d in await bus.find_deliveries(found.groups[0].filter)]) == 2
    assert (await error_groups(bus, failing(DeliveryFilter()))).groups == []


async def test_error_and_payload_filters_and_a_groups_actions(bus) -> None:
    await _failures(bus)

    async def count(
        error_contains: str | None = None,
        payload_contains: str | None = None,
        message_pattern: str | None = None,
    ) -> int:
        flt = DeliveryFilter(
            status="dead", error_contains=error_contains, payload_contains=payload_contains,
            message_pattern=message_pattern,
        )  # fmt: skip
        return await bus.count_deliveries(flt)

    assert await count(error_contains="ORDER 101") == 1, "case is ignored"
    assert await count(error_contains="declined") == 2
    assert await count(error_contains="100%") == 0 and await count(error_contains="c_7") == 0
    assert await count(payload_contains='"vip-') == 2
    assert await count(payload_contains="vip", error_contains="c-8") == 1
    assert await count(message_pattern="LookupError: order <n> not found") == 3
    assert await count(message_pattern="LookupError: order <n> gone") == 0, "it matches the whole error"
    rows = await bus.dead_letters(payload_contains="gone-2")
    assert [r.last_error for r in rows] == ["LookupError: order 102 not found"]
    await _a_group_replays_and_purges_exactly_its_deliveries(bus)


async def _a_group_replays_and_purges_exactly_its_deliveries(bus) -> None:
    missing, declined = (await error_groups(bus, DEAD)).groups
    assert await bus.replay(missing.filter, batch_size=2) == 3
    assert {d.last_error for d in await bus.find_deliveries(DEAD)} == {
        "RuntimeError: card 'c-7' declined",
        "RuntimeError: card 'c-8' declined",
    }
    assert await bus.purge(declined.filter) == 2
    assert await bus.count_deliveries(DEAD) == 0
    assert await bus.count_deliveries(DeliveryFilter(status="pending", subscription="charge")) == 3
