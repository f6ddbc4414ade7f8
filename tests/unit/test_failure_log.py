"""The rate limit of failure log lines, on a controlled clock."""

from __future__ import annotations

import logging

import pytest

from eventbus.backends.base import Failure
from eventbus.types import DeliveryId
from eventbus.worker._failures import FailureLog


def _failure(n: int, error_type: str = "ValueError", subscription: str = "s") -> Failure:
    return Failure(DeliveryId(n), "t", True, 0.0, error_type, f"boom {n}", "", 0.0, "w", subscription, n, 1)


def test_identical_failures_are_summarised_when_their_window_ends(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    failures = FailureLog(
        logging.getLogger("test.failures"), burst=2, window_seconds=10, clock=lambda: now[0]
    )
    caplog.set_level(logging.WARNING, logger="test.failures")
    for n in range(5):
        failures.record(_failure(n))
    failures.record(_failure(9, "KeyError"))  # another kind has its own allowance
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "delivery 0 (event 0) failed on attempt 1 and is dead: ValueError: boom 0",
        "delivery 1 (event 1) failed on attempt 1 and is dead: ValueError: boom 1",
        "delivery 9 (event 9) failed on attempt 1 and is dead: KeyError: boom 9",
    ]
    caplog.clear()
    now[0] = 10.0
    failures.record(_failure(5))
    assert [r.getMessage() for r in caplog.records] == [
        "subscription 's': 3 more ValueError failures were not logged (over 2 in 10s)",
        "subscription 's': delivery 5 (event 5) failed on attempt 1 and is dead: ValueError: boom 5",
    ]
    caplog.clear()
    failures.flush()
    assert caplog.records == []  # nothing was left out since
