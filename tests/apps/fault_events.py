"""Event types of the fault-injection app (importable without building a bus)."""

from __future__ import annotations

from eventbus import Event


class Order(Event, event_type="fault.order"):
    n: int
    pad: str = ""


class Audit(Event, event_type="fault.audit"):
    n: int


class FollowUp(Event, event_type="fault.followup"):
    parent: str


class Flaky(Event, event_type="fault.flaky"):
    n: int


class Hang(Event, event_type="fault.hang"):
    n: int
