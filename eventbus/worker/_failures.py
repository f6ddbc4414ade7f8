"""The log line of each failed attempt, with identical failures rate-limited.

A failure is logged once the database accepted it (a refused, stale result is
logged as refused instead): WARNING when the delivery will be retried, ERROR
when it is dead. A handler failing the same way for every event would flood
the log, so per (subscription, error type) at most ``burst`` lines are written
per ``window_seconds``; the rest are counted and the count is reported when the
window ends (with the next line of that kind, or on the next failure of any
kind, or at :meth:`FailureLog.flush`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..backends.base import Failure

__all__ = ["FailureLog"]

_MESSAGE_CHARS = 500


@dataclass
class _Window:
    started: float
    logged: int = 0
    suppressed: int = 0


def _fields(f: Failure, message: str) -> dict[str, object]:
    """The structured fields of a failure line (see :mod:`eventbus.logs`)."""
    return {
        "event_id": f.event_id,
        "delivery_id": f.delivery_id,
        "subscription": f.subscription,
        "attempt": f.attempt,
        "worker_id": f.worker_id,
        "outcome": "dead" if f.dead else "retry",
        "duration_ms": round(f.duration_seconds * 1000, 3),
        "error_type": f.error_type,
        "error": message,
    }


class FailureLog:
    """Writes one line per failed attempt, at most ``burst`` per kind and window."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logger
        self.burst = burst
        self.window_seconds = window_seconds
        self.clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}

    def record(self, failure: Failure) -> None:
        now = self.clock()
        self._report_ended(now)
        kind = (failure.subscription, failure.error_type)
        window = self._windows.setdefault(kind, _Window(now))
        if window.logged >= self.burst:
            window.suppressed += 1
            return
        window.logged += 1
        self._line(failure)

    def flush(self) -> None:
        """Report every count of lines not written (on stop)."""
        self._report_ended(float("inf"))

    def _report_ended(self, now: float) -> None:
        for kind, window in list(self._windows.items()):
            if now - window.started < self.window_seconds:
                continue
            del self._windows[kind]
            if window.suppressed:
                self.log.warning(
                    "subscription %r: %d more %s failures were not logged (over %d in %.0fs)",
                    kind[0],
                    window.suppressed,
                    kind[1],
                    self.burst,
                    self.window_seconds,
                )

    def _line(self, f: Failure) -> None:
        message = f.message if len(f.message) <= _MESSAGE_CHARS else f.message[:_MESSAGE_CHARS] + "…"
        extra = _fields(f, message)
        if f.dead:
            self.log.error(
                "subscription %r: delivery %s (event %s) failed on attempt %d and is dead: %s: %s",
                f.subscription,
                f.delivery_id,
                f.event_id,
                f.attempt,
                f.error_type,
                message,
                extra=extra,
            )
            return
        self.log.warning(
            "subscription %r: delivery %s (event %s) failed on attempt %d, retrying in %.1fs: %s: %s",
            f.subscription,
            f.delivery_id,
            f.event_id,
            f.attempt,
            f.retry_delay_seconds,
            f.error_type,
            message,
            extra=extra,
        )
