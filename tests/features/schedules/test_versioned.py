"""A schedule publishes its event at the class's version, as any publish does."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from eventbus import Context, Event
from eventbus.testing import drain

from ...conftest import BusFactory


class Tick(Event, event_type="test.versioned_tick", version=2):
    scheduled_for: datetime | None = None
    zone: str = "UTC"


@Tick.upcast(1)
def _tick_v1(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "zone": "local"}


async def test_a_scheduled_event_is_stored_at_its_class_version(make_bus: BusFactory) -> None:
    bus = await make_bus()
    seen: list[Tick] = []

    @bus.subscribe(Tick, name="ticks")
    async def handle(event: Tick, ctx: Context) -> None:
        seen.append(event)

    bus.schedule("ticking", Tick, every=timedelta(hours=1))
    await bus.schedules.declare()
    await bus.register()
    when = await bus.schedules.trigger("ticking")
    assert (await bus.schedules.tick()).fired == 1
    await drain(bus)
    assert seen == [Tick(scheduled_for=when, zone="UTC")]  # version 2: no upcaster ran
    (delivery,) = await bus.find_deliveries()
    assert (await bus.event(delivery.event_id)).event_version == 2
    report = await bus.status()
    assert {t.event_type: t.versions for t in report.event_types}["test.versioned_tick"] == {2: 1}
