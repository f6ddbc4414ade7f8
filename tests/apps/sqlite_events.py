"""Event types of the SQLite fault app (importable without building a bus)."""

from __future__ import annotations

from eventbus import Event


class Job(Event, event_type="sq.job"):
    n: int
    pad: str = ""


class Audit(Event, event_type="sq.audit"):
    n: int


class FollowUp(Event, event_type="sq.followup"):
    parent: str


class Note(Event, event_type="sq.note"):
    parent: str


class Hang(Event, event_type="sq.hang"):
    n: int
