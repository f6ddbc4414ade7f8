"""An application with a versioned event, for the command-line tests (database from EVENTBUS_DSN)."""

from __future__ import annotations

from typing import Any

from eventbus import Bus, Context, Event, RetryPolicy


class CliParcel(Event, event_type="cli.parcel", version=2):
    parcel_id: str
    grams: int


@CliParcel.upcast(1)
def _parcel_v1(payload: dict[str, Any]) -> dict[str, Any]:
    payload["grams"] = payload.pop("kilos") * 1000
    return payload


bus = Bus()


@bus.subscribe(CliParcel, name="cli.parcel", retry=RetryPolicy(max_attempts=1))
async def weigh(event: CliParcel, ctx: Context) -> None:
    if event.grams > 5000:
        raise ValueError(f"{event.parcel_id} is too heavy: {event.grams} g")
