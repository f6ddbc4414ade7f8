"""The order flow: placed -> payment requested -> captured -> shipped."""

from __future__ import annotations

from eventbus import Event


class OrderPlaced(Event, event_type="order.placed"):
    order_id: str
    customer: str
    amount_cents: int


class PaymentRequested(Event, event_type="payment.requested"):
    order_id: str
    amount_cents: int


class PaymentCaptured(Event, event_type="payment.captured"):
    order_id: str
    amount_cents: int


class OrderShipped(Event, event_type="order.shipped"):
    order_id: str
    carrier: str = "post"
