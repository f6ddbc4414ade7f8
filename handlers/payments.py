"""Payment handler: the card gateway declines amounts above a limit."""

from __future__ import annotations

from eventbus import Context, RetryPolicy, Router
from schemas import PaymentCaptured, PaymentRequested

router = Router()

CARD_LIMIT_CENTS = 50_000


class CardDeclined(Exception):
    """The (pretend) card gateway refused the charge."""


@router.subscribe(
    PaymentRequested,
    name="payments.capture",
    retry=RetryPolicy(max_attempts=3, base_delay_seconds=0.2, max_delay_seconds=1.0),
)
async def capture(event: PaymentRequested, ctx: Context) -> None:
    if event.amount_cents > CARD_LIMIT_CENTS:
        raise CardDeclined(f"{event.amount_cents} cents is over the card limit of {CARD_LIMIT_CENTS}")
    ctx.emit(
        PaymentCaptured(order_id=event.order_id, amount_cents=event.amount_cents),
        key=f"captured:{event.order_id}",
    )
