"""Invoices rendered outside the workers: a pulled subscription that a batch job claims.

No worker serves ``invoices``: :func:`render_invoices` (a batch job) takes its
deliveries with ``bus.pull.claim``, and a process in another language can do
the same through the command line, settling each delivery by its id and lease
token in a later command::

    eventbus claim invoices --limit 10 --lease-seconds 120 --app handlers.app:bus
    eventbus complete ID --token TOKEN --app handlers.app:bus
    eventbus fail ID --token TOKEN --error "renderer down" --retry-in 60 --app handlers.app:bus
"""

from __future__ import annotations

from eventbus import Bus
from schemas import OrderShipped

SUBSCRIPTION = "invoices"


class RendererDown(Exception):
    """The pretend PDF renderer is unavailable."""


def declare(bus: Bus) -> None:
    """Declare the pulled subscription on the application's bus."""
    bus.pull.subscription(OrderShipped, name=SUBSCRIPTION, max_attempts=5, lease_seconds=120)


def render(event: OrderShipped) -> bytes:
    """The pretend renderer: a PDF's bytes for one shipped order."""
    if not event.order_id:
        raise RendererDown("no order id")
    return f"%PDF invoice for order {event.order_id} ({event.carrier})".encode()


async def render_invoices(bus: Bus, limit: int = 10) -> list[str]:
    """Claim and settle one batch of invoices; return the orders rendered.

    Leaving the block hands back whatever was not settled (say, the job is
    stopped half-way), the attempts not counted.
    """
    rendered = []
    async with bus.pull.claim(SUBSCRIPTION, limit=limit) as batch:
        for d in batch:
            assert isinstance(d.event, OrderShipped)  # the subscription's class
            try:
                render(d.event)
            except RendererDown as exc:
                await d.fail(exc)  # retried by the subscription's policy, dead after five attempts
                continue
            if await d.complete():  # False: the lease ran out and someone else has it now
                rendered.append(d.event.order_id)
    return rendered
