"""A tiny application for the command-line tests (database from EVENTBUS_DSN)."""

from __future__ import annotations

from eventbus import Bus, Context, Event, RetryPolicy


class CliOrder(Event, event_type="cli.order"):
    order_id: str


bus = Bus()


@bus.subscribe(CliOrder, name="cli.handle", retry=RetryPolicy(max_attempts=1))
async def handle(event: CliOrder, ctx: Context) -> None:
    if event.order_id == "fail":
        raise ValueError("refused by the test handler")
