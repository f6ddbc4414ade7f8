"""One fan-out schedule occurrence to N tenants (10,000 by default), on either backend.

    python -m benchmarks.fanout --backend postgres [--dsn postgresql://…] [--tenants N] [--json out.json]
    python -m benchmarks.fanout --backend sqlite

On a scratch schema or file: a schedule with ``start=machine`` and
``for_each=`` (an async lister returning N tenant keys) is made due and
ticked; then

- ``tick_ms``: the tick that records the occurrence and fires its one fan-out event;
- ``fan_out_seconds``: a burst worker serving only the fan-out subscription, from
  its start to its exit: the lister, N checked and keyed start events, and the
  completion that commits all of them in one transaction;
- ``start_seconds``: a burst worker serving only the machine's start subscription
  until the N runs are started (the rate at which the fanned-out work begins).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec

from eventbus import Bus, Worker
from eventbus.testing import temporary_bus
from eventbus.workflows import Machine


class Retrain(msgspec.Struct):
    customer: str


machine = Machine("bench-retrain", checkpoint=Retrain, key=lambda c: c.customer)


@machine.state(initial=True, on_success="DONE", on_failure="DONE")
async def TRAIN(c: Retrain, ctx: object) -> None:
    return None


machine.terminal("DONE")


async def _burst(bus: Bus, subscription: str) -> tuple[float, int]:
    worker = Worker(bus, burst=True, subscriptions=[subscription], batch_size=500, concurrency=200)
    started = time.perf_counter()
    await worker.run()
    return time.perf_counter() - started, worker.processed


async def fan_out(dsn: str | None, tenants: int) -> dict[str, Any]:
    names = [f"customer-{i:06d}" for i in range(tenants)]

    async def customers() -> list[str]:
        return names

    pool: dict[str, Any] = {} if dsn is None else {"max_pool_size": 8}
    async with temporary_bus(dsn, **pool) as bus:
        bus.include(machine)
        anchor = datetime.now(UTC) - timedelta(minutes=30)
        bus.schedule(
            "retrain-all", start=machine, checkpoint=lambda t, when: Retrain(customer=t),
            every=timedelta(hours=1), anchor=anchor, for_each=customers,
        )  # fmt: skip
        await bus.register()
        await bus.schedules.declare()
        await bus.schedules.backfill("retrain-all", anchor, anchor)
        started = time.perf_counter()
        report = await bus.schedules.tick()
        tick_ms = (time.perf_counter() - started) * 1000
        assert report.fired == 1, report
        fan_seconds, fanned = await _burst(bus, "schedule.retrain-all")
        start_seconds, started_runs = await _burst(bus, "wf.bench-retrain.start")
        status = {(r.subscription, r.status): r.count for r in (await bus.status()).rows}
        assert fanned == 1 and started_runs == tenants, (fanned, started_runs, status)
        assert status[("wf.bench-retrain.start", "completed")] == tenants
    return {
        "scenario": "fan_out_occurrence",
        "backend": "sqlite" if dsn is None else "postgres",
        "tenants": tenants,
        "tick_ms": round(tick_ms, 1),
        "fan_out_seconds": round(fan_seconds, 3),
        "fan_out_events_per_second": round(tenants / fan_seconds),
        "start_seconds": round(start_seconds, 3),
        "runs_started_per_second": round(tenants / start_seconds),
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    dsn = args.dsn if args.backend == "postgres" else None
    out = []
    for _ in range(args.runs):
        out.append(await fan_out(dsn, args.tenants))
        print(out[-1])
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", help="Write the results here.")
    options = parser.parse_args()
    results = anyio.run(main, options)
    if options.json:
        with open(options.json, "w") as f:
            json.dump(results, f, indent=2)
