"""What a state function returns besides ``None`` (the success edge).

Each outcome checks its fields when it is made, so a state that builds one
wrongly raises :class:`~eventbus.errors.InvalidOutcome` inside its own visit:
like any exception, that is a failure transition with the error in the history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from ..errors import ConfigurationError, EventBusError, InvalidOutcome

__all__ = ["MAX_SECONDS", "Fail", "Goto", "Outcome", "Uncertain", "Yield", "seconds"]

MAX_SECONDS = 100 * 365 * 86400.0
"""The longest duration a machine accepts (a poll, a timeout, an age): beyond it a duration is a mistake."""


def seconds(value: timedelta | float | None, error: type[EventBusError] = ConfigurationError) -> float | None:
    """A duration in seconds (None stays None); ``error`` for one that is negative, not finite or too long."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (timedelta, int, float)):
        raise error(f"a duration is a timedelta or a number of seconds, not {type(value).__name__}")
    out = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if out < 0:
        raise error(f"durations cannot be negative, got {out}")
    if not math.isfinite(out) or out > MAX_SECONDS:
        raise error(f"a duration must be a finite number of seconds up to 100 years, got {out}")
    return out


def _text(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise InvalidOutcome(f"{name} must be a non-empty str, not {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class Yield:
    """Stay in this state and come back after the state's ``poll`` (or ``poll`` given here).

    The visit commits and frees its worker; nothing is held while waiting. A
    signal named in the state's ``wake_on`` ends the wait early. ``poll`` is
    a duration up to 100 years (:class:`~eventbus.errors.InvalidOutcome` otherwise).

    ``children`` waits on the run's child machines (started with
    ``ctx.start``) instead of a poll: ``"all"`` until every child of the run
    has ended, ``"any"`` until one more has ended than had when this visit
    read them, or a number ``n`` until ``n`` more have. The state is visited
    again then, once, with the children's outcomes in ``ctx.children``
    (``poll``, when given here, bounds the wait). Waiting on more children
    than are live, or on none, is an :class:`~eventbus.errors.InvalidOutcome`
    and takes the failure edge.
    """

    poll: timedelta | float | None = None
    children: Literal["all", "any"] | int | None = None

    def __post_init__(self) -> None:
        seconds(self.poll, InvalidOutcome)
        c = self.children
        if c is None or c in ("all", "any"):
            return
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise InvalidOutcome(f'Yield children is "all", "any" or a count of at least 1, not {c!r}')


@dataclass(frozen=True)
class Fail:
    """Take the failure edge, recording ``code`` (and ``message``) as the error.

    ``code`` is a short non-empty str such as ``"payment-declined"``.
    Use :class:`Goto` for a branch that is not an error: a ``Fail`` is
    recorded as an error in the history and as the instance's ``last_error``
    (cleared when the run ends ``completed``).
    """

    code: str
    message: str | None = None

    def __post_init__(self) -> None:
        _text("Fail code", self.code)
        _text("Fail message", self.message, optional=True)


@dataclass(frozen=True)
class Goto:
    """Take the edge to ``state``, which must be one of the state's declared edges."""

    state: str

    def __post_init__(self) -> None:
        _text("Goto state", self.state)


@dataclass(frozen=True)
class Uncertain:
    """Stop for a human: the outcome of an external effect cannot be told."""

    reason: str

    def __post_init__(self) -> None:
        _text("Uncertain reason", self.reason)


Outcome = Yield | Fail | Goto | Uncertain | None
"""What a state function returns; ``None`` takes the success edge."""
