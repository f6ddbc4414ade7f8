"""Event types and helpers shared by the tests."""

from __future__ import annotations

from collections import Counter

from eventbus import Bus, Event, RetryPolicy
from eventbus.testing import drain

__all__ = ["FAST", "OrderPlaced", "PaymentRequested", "Shipped", "counts", "drain"]


class OrderPlaced(Event, event_type="test.order_placed"):
    order_id: str
    amount_cents: int = 100


class PaymentRequested(Event, event_type="test.payment_requested"):
    order_id: str


class Shipped(Event, event_type="test.shipped"):
    order_id: str


FAST = RetryPolicy(max_attempts=3, base_delay_seconds=0.0, jitter=0.0)


async def counts(bus: Bus) -> Counter[tuple[str, str]]:
    """(subscription, status) -> number of deliveries."""
    report = await bus.status()
    return Counter({(r.subscription, r.status): r.count for r in report.rows})
