"""Shipping handler: tell the customer their order left the warehouse."""

from __future__ import annotations

import logging

from eventbus import Context, Router
from schemas import OrderShipped

router = Router()
log = logging.getLogger("example.shipping")


@router.subscribe(OrderShipped, name="shipping.notify-customer")
async def notify_customer(event: OrderShipped, ctx: Context) -> None:
    log.info(
        "order %s shipped by %s (chain root event %d)", event.order_id, event.carrier, ctx.correlation_id
    )
