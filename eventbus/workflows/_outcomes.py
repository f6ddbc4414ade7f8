"""What a state function returns besides ``None`` (the success edge)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

__all__ = ["Fail", "Goto", "Outcome", "Uncertain", "Yield"]


@dataclass(frozen=True)
class Yield:
    """Stay in this state and come back after the state's ``poll`` (or ``poll`` given here).

    The visit commits and frees its worker; nothing is held while waiting. A
    signal named in the state's ``wake_on`` ends the wait early.
    """

    poll: timedelta | float | None = None


@dataclass(frozen=True)
class Fail:
    """Take the failure edge, recording ``code`` (and ``message``) as the error."""

    code: str
    message: str | None = None


@dataclass(frozen=True)
class Goto:
    """Take the edge to ``state``, which must be one of the state's declared edges."""

    state: str


@dataclass(frozen=True)
class Uncertain:
    """Stop for a human: the outcome of an external effect cannot be told."""

    reason: str


Outcome = Yield | Fail | Goto | Uncertain | None
"""What a state function returns; ``None`` takes the success edge."""
