"""What the dashboard tests look at: a chain with dead letters, an approval waiting, a schedule."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from eventbus import Bus, Context, Event, RetryPolicy
from eventbus.workflows import Approval, Machine, StepContext

from ...support.helpers import OrderPlaced, PaymentRequested, Shipped, drain
from ..workflows._support import run_until, status_is

__all__ = ["Charge", "Tick", "drain_orders", "pay", "seed", "state"]


class Tick(Event, event_type="test.tick"):
    scheduled_for: datetime | None = None


class Charge(msgspec.Struct):
    key: str
    amount: int = 100


pay = Machine("pay", checkpoint=Charge, key=lambda c: c.key)


@pay.state(
    initial=True,
    on_success="DONE",
    on_failure="DONE",
    approval=Approval(timeout=timedelta(hours=1), on_deny="DENIED", on_timeout="DENIED"),
)
async def CHARGE(c: Charge, ctx: StepContext) -> None:
    pass


pay.terminal("DONE")
pay.terminal("DENIED", failed=True)

state = {"broken": True}


def declare(bus: Bus) -> None:
    """Subscriptions, the machine and a schedule: OrderPlaced -> PaymentRequested -> Shipped."""
    retry = RetryPolicy(max_attempts=2, base_delay_seconds=0)

    @bus.subscribe(OrderPlaced, name="charge", retry=retry)
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        if state["broken"] and event.order_id.startswith("bad"):
            raise RuntimeError(f"card declined <b>{event.order_id}</b>")
        ctx.emit(PaymentRequested(order_id=event.order_id))

    @bus.subscribe(PaymentRequested, name="ship")
    async def ship(event: PaymentRequested, ctx: Context) -> None:
        ctx.emit(Shipped(order_id=event.order_id))

    @bus.subscribe(Shipped, name="notify")
    async def notify(event: Shipped, ctx: Context) -> None:
        pass

    bus.include(pay)
    bus.schedule("hourly-report", Tick, every=timedelta(hours=1))


async def seed(bus: Bus, good: int = 3, bad: int = 3) -> None:
    state["broken"] = True
    declare(bus)
    orders = [OrderPlaced(order_id=f"ok-{i}", amount_cents=100 * i) for i in range(good)]
    orders += [OrderPlaced(order_id=f"bad-{i}<script>", amount_cents=7) for i in range(bad)]
    await bus.publish_many(orders)
    await drain(bus)
    await bus.schedules.declare()
    await bus.schedules.trigger("hourly-report")
    await bus.schedules.tick()
    await bus.workflows.start(pay, Charge(key="c-1"))
    await run_until(bus, lambda: status_is(bus, pay, "c-1", "waiting_approval"))


async def drain_orders(bus: Bus) -> None:
    """Run the order subscriptions only (the machine's step waits an hour for its approval timeout)."""
    await drain(bus, subscriptions=["charge", "ship", "notify"])
