"""The worker's schedule ticker: every worker ticks, no leader.

It records the bus's schedules when the worker starts, then ticks: each tick
claims due schedules in one guarded transaction (see
:class:`eventbus.backends.base.ScheduleStore`), and the ticker sleeps until
the next one is due by the database's clock (at least 50 ms, at most a
second), so a schedule fires within about a second of its time, usually
within tens of milliseconds, and a new trigger is seen as soon.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from ..errors import BackendError

if TYPE_CHECKING:
    from ..bus import Bus

__all__ = ["run_schedules"]

log = logging.getLogger("eventbus.worker")

_MAX_SLEEP = 1.0
# Ticks at most this often: schedules due within it share one transaction
# (10,000 schedules a minute cost a third as much as ticking for each).
_MIN_SLEEP = 0.05
_BATCH = 100


async def run_schedules(bus: Bus, stopping: Callable[[], bool]) -> None:
    """Declare the bus's schedules, then tick them until ``stopping()``."""
    if not bus.schedules.declared:
        return
    planner = bus.schedules.planner()
    while not stopping():
        try:
            await bus.backend.schedules.declare([s.decl() for s in bus.schedules.declared.values()], planner)
            break
        except BackendError as exc:
            log.warning("recording schedules failed (%s); retrying", exc)
            await anyio.sleep(_MAX_SLEEP)
    while not stopping():
        try:
            report = await bus.backend.schedules.tick(planner, _BATCH)
        except BackendError as exc:
            log.warning("schedule tick failed (%s); retrying", exc)
            await anyio.sleep(_MAX_SLEEP)
            continue
        except Exception:  # a bug in a tick must not take the worker's handlers down with it
            log.exception("schedule tick failed; retrying")
            await anyio.sleep(_MAX_SLEEP)
            continue
        due_in = _MAX_SLEEP if report.next_due_in is None else report.next_due_in
        await anyio.sleep(0 if report.full else min(max(due_in, _MIN_SLEEP), _MAX_SLEEP))
