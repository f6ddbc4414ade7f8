"""Priorities: the range, the default step, and the checks every entry point shares.

Lower runs first within a subscription (0, the default, first). Each level is
worth ``priority_step_seconds`` of waiting (``DEFAULT_PRIORITY_STEP_SECONDS``
unless the bus says otherwise): a delivery of priority p sorts as if it had
become due p steps later, so it never waits more than p steps behind fresh
work of priority 0 (see the Priorities guide).
"""

from __future__ import annotations

from .errors import InvalidPriority

__all__ = [
    "DEFAULT_PRIORITY_STEP_SECONDS",
    "MAX_PRIORITY",
    "MAX_PRIORITY_STEP_SECONDS",
    "MIN_PRIORITY",
    "checked_priority",
    "checked_priority_step",
]

MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY_STEP_SECONDS = 60.0
MAX_PRIORITY_STEP_SECONDS = 86400.0


def checked_priority(value: object) -> int:
    """A priority the database can store; :class:`~eventbus.errors.InvalidPriority` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPriority(f"priority must be an int from 0 to 9, not {type(value).__name__}: {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidPriority(f"priority must be from {MIN_PRIORITY} (first) to {MAX_PRIORITY}, got {value}")
    return value


def checked_priority_step(value: object) -> float:
    """A priority step: a positive, finite number of seconds up to a day."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidPriority(f"priority_step_seconds must be a number, not {type(value).__name__}")
    if not 0 < value <= MAX_PRIORITY_STEP_SECONDS:  # NaN fails both comparisons
        raise InvalidPriority(f"priority_step_seconds must be above 0 and at most a day, got {value}")
    return float(value)
