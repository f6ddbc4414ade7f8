"""Events of the schedule tests."""

from __future__ import annotations

from datetime import datetime

from eventbus import Event


class Beat(Event, event_type="test.beat"):
    scheduled_for: datetime | None = None


class Report(Event, event_type="test.report"):
    scheduled_for: datetime | None = None
    title: str = "nightly"


class Plain(Event, event_type="test.plain"):
    note: str = "no time field"


class Broken(Event, event_type="test.broken"):
    """Builds for the declaration check (1970), fails for any real occurrence."""

    scheduled_for: datetime | None = None

    def __post_init__(self) -> None:
        if self.scheduled_for is not None and self.scheduled_for.year > 1970:
            raise ValueError("this event cannot be built")
