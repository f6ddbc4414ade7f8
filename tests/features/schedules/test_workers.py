"""Schedules ticked by real worker processes: no leader, no duplicates, no gaps, the database's clock.

Worker processes run ``tests.apps.schedule_app`` (every-second schedules whose
events have no subscription, so a fired occurrence is its event in the log).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from eventbus import Bus
from eventbus.schedules import occurrence_key

from ...conftest import Target
from ...support.processes import EVENTBUS, ROOT, Proc, ProcessGroup
from ._support import db_now, event_keys


@pytest.fixture
async def procs(tmp_path: Path) -> AsyncIterator[ProcessGroup]:
    group = ProcessGroup(tmp_path)
    try:
        yield group
    finally:
        await group.aclose()


def _worker(procs: ProcessGroup, target: Target, name: str, **env: str) -> Proc:
    cmd = [EVENTBUS, "worker", "tests.apps.schedule_app:bus", "--poll-interval", "1", "--grace", "1"]
    return procs.spawn(cmd, {**target.env(), **env}, name)


async def _migrated(target: Target) -> Bus:
    bus = target.bus()
    await bus.migrate()
    return bus


def _to_next_second() -> float:
    now = time.time()
    return math.ceil(now) - now


async def _serving(bus: Bus, workers: list[Proc], timeout: float = 60) -> None:
    """Until every worker process has reported itself (it ticks schedules from then on)."""
    with anyio.fail_after(timeout):
        while {w.pid for w in workers} - {r.pid for r in (await bus.status()).workers}:
            assert all(w.alive() for w in workers), [w.output() for w in workers]
            await asyncio.sleep(0.05)


async def _stop(workers: list[Proc]) -> None:
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert await w.wait_async(15) == 0, w.output()


async def _assert_each_second_fired_once(bus: Bus, target: Target, names: list[str]) -> int:
    """Every schedule: consecutive seconds, each fired, each with exactly one event of its key."""
    keys = await event_keys(target, "test.beat")
    assert len(keys) == len(set(keys)), "an occurrence fired twice"
    total = 0
    for name in names:
        occurrences = sorted(await bus.schedules.occurrences(name, 10_000), key=lambda o: o.scheduled_for)
        times = [o.scheduled_for for o in occurrences]
        assert times == [times[0] + timedelta(seconds=i) for i in range(len(times))], f"{name} has a gap"
        assert {o.status for o in occurrences} == {"fired"}
        assert sorted(k for k in keys if k.startswith(f"{name}@")) == sorted(
            occurrence_key(name, t) for t in times
        )
        total += len(times)
    assert total == len(keys)
    return total


async def test_two_workers_fire_an_every_second_schedule_once_per_second(
    target: Target, procs: ProcessGroup
) -> None:
    bus = await _migrated(target)
    try:
        spawned = time.monotonic()
        workers = [_worker(procs, target, f"w{i}") for i in range(2)]
        await _serving(bus, workers)
        await asyncio.sleep(4.0)  # both tick for 4 s
        await _stop(workers)
        fired = await _assert_each_second_fired_once(bus, target, ["sec-0"])
        # At least one per second both ticked; at most one per second since the first started.
        assert 3 <= fired <= math.ceil(time.monotonic() - spawned) + 1
        for o in await bus.schedules.occurrences("sec-0", 100):
            assert o.fired_at is not None and timedelta(0) <= o.fired_at - o.scheduled_for < timedelta(
                seconds=1
            )
    finally:
        await bus.aclose()


async def test_sigkill_mid_tick_never_loses_or_doubles_an_occurrence(
    target: Target, procs: ProcessGroup
) -> None:
    """100 every-second schedules; a serving worker is SIGKILLed 12 times as a second starts, and restarted.

    Every occurrence falls due on a whole second, so each kill lands in the
    first tens of milliseconds of a tick (this machine's clock is the
    database's), where the transaction has claimed, published and recorded
    only part of its batch. Each kill waits until both workers serve: a kill
    of a worker still starting (slow on a loaded machine) would hit no tick.
    """
    bus = await _migrated(target)
    env = {"SCHEDULE_COUNT": "100"}
    rng = random.Random(11)
    try:
        workers = [_worker(procs, target, f"w{i}", **env) for i in range(2)]
        for kill in range(12):
            await _serving(bus, workers)
            await asyncio.sleep(_to_next_second() + rng.uniform(0.002, 0.04))
            victim = rng.randrange(len(workers))
            workers[victim].kill()
            workers[victim] = _worker(procs, target, f"r{kill}", **env)
        await _serving(bus, workers)  # a restarted worker stopped before it serves dies of the SIGTERM
        await asyncio.sleep(2.5)  # the survivors catch up ("all")
        await _stop(workers)
        fired = await _assert_each_second_fired_once(bus, target, [f"sec-{n}" for n in range(100)])
        assert fired >= 100 * 4
    finally:
        await bus.aclose()


async def test_a_worker_whose_clock_is_off_fires_nothing_early_or_late(
    target: Target, procs: ProcessGroup
) -> None:
    """Workers 10 minutes ahead and behind: an hourly occurrence 5 minutes away stays unfired."""
    bus = await _migrated(target)
    anchor = await db_now(target) + timedelta(minutes=5)
    skewed = {
        "PYTHONPATH": f"{ROOT / 'tests' / 'apps' / 'skewed_clock'}{os.pathsep}{ROOT}",
        "SCHEDULE_HOURLY": "1",
        "SCHEDULE_ANCHOR": str(anchor.timestamp()),
    }
    try:
        workers = [
            _worker(procs, target, "ahead", EVENTBUS_TEST_CLOCK_SKEW="600", **skewed),
            _worker(procs, target, "behind", EVENTBUS_TEST_CLOCK_SKEW="-600", **skewed),
        ]
        await _serving(bus, workers)
        await asyncio.sleep(3.0)  # both tick for 3 s
        await _stop(workers)
        assert await bus.schedules.occurrences("hourly") == []
        assert (await bus.schedules.info("hourly")).next_occurrence_at == anchor
        ticked = await bus.schedules.occurrences("sec-0", 100)
        assert len(ticked) >= 2
        for o in ticked:
            assert o.fired_at is not None and timedelta(0) <= o.fired_at - o.scheduled_for < timedelta(
                seconds=1
            )
    finally:
        await bus.aclose()
