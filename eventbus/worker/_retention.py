"""Retention inside workers: a pass every ``Retention.interval``, one pruner at a time."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

import anyio

from ..errors import BackendError
from ..retention import Pruner

if TYPE_CHECKING:
    from ..bus import Bus

__all__ = ["run_retention"]

log = logging.getLogger("eventbus.retention")


async def run_retention(bus: Bus) -> None:
    """Prune periodically until cancelled; a no-op loop when the bus's retention has no interval.

    The first pass waits a random part of the interval, so workers started
    together do not all try the lock at once (the losers skip at once anyway).
    """
    retention = bus.retention
    if retention.interval is None:
        return
    interval = retention.interval.total_seconds()
    pruner = Pruner(bus.backend.retention, retention)
    await anyio.sleep(random.uniform(0.1, 1.0) * interval)
    while True:
        try:
            report = await pruner.run()
        except BackendError as exc:
            log.warning("pruning failed (next pass in %.0fs): %s", interval, exc)
        else:
            if report.total:
                log.info(
                    "pruned %d completed and %d dead deliveries, %d events in %.2fs",
                    report.completed_deliveries,
                    report.dead_deliveries,
                    report.events,
                    report.seconds,
                    extra={"outcome": "pruned"},
                )
        await anyio.sleep(interval)
