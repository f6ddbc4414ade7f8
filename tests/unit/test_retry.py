"""The retry decision, without a worker."""

from __future__ import annotations

from eventbus import DeadLetter, Retry, RetryPolicy
from eventbus.retry import Outcome


def test_outcome_of_a_failed_attempt() -> None:
    policy = RetryPolicy(max_attempts=3, base_delay_seconds=2, jitter=0, non_retryable=(KeyError,))
    assert policy.outcome(ValueError("x"), 1) == Outcome(dead=False, delay_seconds=2.0)
    assert policy.outcome(ValueError("x"), 2) == Outcome(dead=False, delay_seconds=4.0)
    assert policy.outcome(ValueError("x"), 3) == Outcome(dead=True)
    assert policy.outcome(KeyError("k"), 1) == Outcome(dead=True)
    assert policy.outcome(DeadLetter("no"), 1) == Outcome(dead=True)
    assert policy.outcome(Retry(delay=0.5), 1) == Outcome(dead=False, delay_seconds=0.5)
    assert policy.outcome(Retry(), 2) == Outcome(dead=False, delay_seconds=4.0)
    assert policy.outcome(Retry(delay=0.5), 3) == Outcome(dead=True)


def test_a_retry_delay_past_the_cap_or_not_a_number_is_bounded() -> None:
    policy = RetryPolicy(max_attempts=3, base_delay_seconds=2, max_delay_seconds=60, jitter=0)
    assert policy.outcome(Retry(delay=float("inf")), 1) == Outcome(dead=False, delay_seconds=60.0)
    assert policy.outcome(Retry(delay=3600), 1) == Outcome(dead=False, delay_seconds=60.0)
    assert policy.outcome(Retry(delay=float("nan")), 1) == Outcome(dead=False, delay_seconds=2.0)
    assert policy.outcome(Retry(delay=-5), 1) == Outcome(dead=False, delay_seconds=2.0)
