"""Schedule tick cost and firing delay with 10,000 schedules, on either backend.

    python -m benchmarks.schedules --backend postgres [--dsn postgresql://…] [--schedules N] [--seconds S]
    python -m benchmarks.schedules --backend sqlite

Scenarios, each on a scratch schema or file:

- idle tick: a tick when nothing is due, with 10 and with N schedules
  declared (the claim is an index range on next_run_at: it should not grow);
- steady firing: N schedules every 60 s, their anchors spread over the
  minute (N/60 occurrences a second), ticked by the worker's ticker for ``--seconds``:
  firing delay (``fired_at - scheduled_for``, database clock) p50/p99/max and
  the tick's cost per fired occurrence (busy time of the ticker / fired).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta
from typing import Any

import anyio

from eventbus import Bus, Event
from eventbus.schedules import EPOCH
from eventbus.testing import temporary_bus
from eventbus.worker._upkeep import ScheduleTicks


class Due(Event, event_type="bench.due"):
    pass


def _declare(bus: Bus, n: int, period: float) -> None:
    for i in range(n):
        anchor = EPOCH + timedelta(seconds=period * i / n)
        bus.schedule(f"s{i:05d}", Due, every=timedelta(seconds=period), anchor=anchor, missed="latest")


async def idle_tick(dsn: str | None, n: int, ticks: int = 200) -> dict[str, Any]:
    async with temporary_bus(dsn) as bus:
        _declare(bus, n, period=3600.0)  # nothing due for the next hour, at most one... per 0.36 s
        started = time.perf_counter()
        await bus.schedules.declare()
        declared = time.perf_counter() - started
        planner = bus.schedules.planner()
        samples = []
        for _ in range(ticks):
            t = time.perf_counter()
            await bus.schedules.tick(planner=planner)
            samples.append((time.perf_counter() - t) * 1000)
    return {
        "scenario": "idle_tick",
        "schedules": n,
        "declare_seconds": round(declared, 3),
        "tick_ms_p50": round(statistics.median(samples), 3),
        "tick_ms_p99": round(sorted(samples)[int(len(samples) * 0.99) - 1], 3),
    }


async def steady(dsn: str | None, n: int, seconds: float, period: float = 60.0) -> dict[str, Any]:
    async with temporary_bus(dsn) as bus:
        _declare(bus, n, period)
        await bus.schedules.declare()
        planner = bus.schedules.planner()
        busy, fired, ticks = 0.0, 0, 0
        tick = bus.backend.schedules.tick

        async def timed(*args: Any) -> Any:  # the worker's own ticker, with its ticks timed
            nonlocal busy, fired, ticks
            t = time.perf_counter()
            report = await tick(*args)
            busy, fired, ticks = busy + time.perf_counter() - t, fired + report.fired, ticks + 1
            return report

        bus.backend.schedules.tick = timed  # type: ignore[method-assign]
        deadline = time.monotonic() + seconds
        await ScheduleTicks(bus).run(lambda: time.monotonic() > deadline)
        delays = []
        for name in planner.names():
            for o in await bus.schedules.occurrences(name, 100):
                if o.fired_at is not None:
                    delays.append((o.fired_at - o.scheduled_for).total_seconds() * 1000)
    delays.sort()
    return {
        "scenario": "steady_firing",
        "schedules": n,
        "per_second": round(n / period, 1),
        "seconds": seconds,
        "fired": fired,
        "ticks": ticks,
        "fired_per_tick": round(fired / max(ticks, 1), 1),
        "tick_ms_per_fired": round(busy * 1000 / max(fired, 1), 3),
        "ticker_busy_share": round(busy / seconds, 3),
        "delay_ms_p50": round(delays[len(delays) // 2], 1) if delays else None,
        "delay_ms_p99": round(delays[int(len(delays) * 0.99) - 1], 1) if delays else None,
        "delay_ms_max": round(delays[-1], 1) if delays else None,
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    dsn = args.dsn if args.backend == "postgres" else None
    out = [await idle_tick(dsn, 10), await idle_tick(dsn, args.schedules)]
    for r in out:
        print(r)
    out.append(await steady(dsn, args.schedules, args.seconds))
    print(out[-1])
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", help="Write the results here.")
    options = parser.parse_args()
    results = anyio.run(main, options)
    if options.json:
        with open(options.json, "w") as f:
            json.dump(results, f, indent=2)
