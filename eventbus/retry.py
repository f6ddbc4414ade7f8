"""Retry policy: capped exponential backoff with jitter (pure functions)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from .errors import ConfigurationError, DeadLetter, Retry

__all__ = ["Outcome", "RetryPolicy"]


@dataclass(frozen=True)
class Outcome:
    """What becomes of a failed attempt: dead, or retried after ``delay_seconds``."""

    dead: bool
    delay_seconds: float = 0.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how soon a failed delivery is tried again.

    The delay before attempt ``n + 1`` is ``base_delay_seconds * 2 ** (n - 1)``,
    capped at ``max_delay_seconds``, then spread by ``± jitter`` (a fraction) so
    failures of many deliveries do not retry in lock-step. The delay is added to
    the database clock, never the worker's.
    """

    max_attempts: int = 5
    base_delay_seconds: float = 1.0
    max_delay_seconds: float = 300.0
    jitter: float = 0.2
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if self.base_delay_seconds < 0 or self.max_delay_seconds < 0:
            raise ConfigurationError("retry delays cannot be negative")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError("jitter is a fraction between 0 and 1")

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The (lowest, highest) delay after failed attempt number ``attempt`` (1-based)."""
        exponent = min(max(attempt - 1, 0), 62)
        delay = min(self.max_delay_seconds, self.base_delay_seconds * 2.0**exponent)
        return delay * (1 - self.jitter), min(self.max_delay_seconds, delay * (1 + self.jitter))

    def delay_for(self, attempt: int) -> float:
        """A delay within :meth:`bounds` for failed attempt number ``attempt``."""
        low, high = self.bounds(attempt)
        return random.uniform(low, high)

    def exhausted(self, attempt: int) -> bool:
        """Whether attempt number ``attempt`` was the last one allowed."""
        return attempt >= self.max_attempts

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` may be retried: it is none of ``non_retryable``."""
        return not isinstance(exc, self.non_retryable)

    def outcome(self, exc: BaseException, attempt: int) -> Outcome:
        """Decide the fate of failed attempt number ``attempt`` that raised ``exc``.

        :class:`DeadLetter`, a non-retryable error or the last allowed attempt
        end the delivery; :class:`Retry` picks its own delay; anything else
        backs off by :meth:`delay_for`.
        """
        if isinstance(exc, DeadLetter) or not self.is_retryable(exc) or self.exhausted(attempt):
            return Outcome(dead=True)
        if isinstance(exc, Retry) and exc.delay is not None and 0 <= exc.delay <= self.max_delay_seconds:
            return Outcome(dead=False, delay_seconds=exc.delay)
        if isinstance(exc, Retry) and exc.delay is not None and exc.delay > self.max_delay_seconds:
            return Outcome(dead=False, delay_seconds=self.max_delay_seconds)  # inf included
        return Outcome(dead=False, delay_seconds=self.delay_for(attempt))


def policy_with(retry: RetryPolicy | None, max_attempts: int | None) -> RetryPolicy:
    """``retry`` (the default policy when None), with ``max_attempts`` in place of its own when given."""
    policy = retry or RetryPolicy()
    return policy if max_attempts is None else replace(policy, max_attempts=max_attempts)
