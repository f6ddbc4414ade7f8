"""An application with pulled subscriptions, for the pull commands' tests (database from EVENTBUS_DSN)."""

from __future__ import annotations

from eventbus import Bus, Event, RetryPolicy


class Job(Event, event_type="pull.job"):
    n: int


class JobDone(Event, event_type="pull.done"):
    n: int


RETRY = RetryPolicy(max_attempts=3, base_delay_seconds=0.0, jitter=0.0)

bus = Bus()


def declare(target: Bus) -> None:
    """Declare this application's pulled subscriptions on ``target`` (the tests' own bus too)."""
    target.pull.subscription(Job, name="pull.jobs", retry=RETRY)
    target.pull.subscription(JobDone, name="pull.done")


declare(bus)
