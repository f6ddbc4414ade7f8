"""Order handlers: request a payment for each order, ship captured orders."""

from __future__ import annotations

import logging

from eventbus import Context, Router
from schemas import OrderPlaced, OrderShipped, PaymentCaptured, PaymentRequested

router = Router()
log = logging.getLogger("example.orders")


@router.subscribe(OrderPlaced, name="orders.request-payment")
async def request_payment(event: OrderPlaced, ctx: Context) -> None:
    ctx.emit(
        PaymentRequested(order_id=event.order_id, amount_cents=event.amount_cents),
        key=f"payment:{event.order_id}",
    )


@router.subscribe(PaymentCaptured, name="orders.ship")
async def ship(event: PaymentCaptured, ctx: Context) -> None:
    ctx.emit(OrderShipped(order_id=event.order_id), key=f"ship:{event.order_id}")


@router.subscribe(OrderPlaced, name="orders.audit")
async def audit(event: OrderPlaced, ctx: Context) -> None:
    log.info("order %s placed by %s for %d cents", event.order_id, event.customer, event.amount_cents)
