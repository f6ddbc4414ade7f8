"""Event types of the shutdown tests' app (importable without building a bus)."""

from __future__ import annotations

from eventbus import Event


class Quick(Event, event_type="life.quick"):
    n: int


class Slow(Event, event_type="life.slow"):
    n: int


class Stuck(Event, event_type="life.stuck"):
    n: int
