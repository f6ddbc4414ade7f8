"""eventbus through the same harness as the peers.

    python -m benchmarks.peers.eventbus_bench \
        --dsn postgresql://postgres@127.0.0.1:5432/bench_eventbus --n 20000 --json out.json

Public API only: Bus.publish / publish_many, @bus.subscribe, Worker.run / stop.
The drain settings include the append-only hot path (``Bus(dsn,
append_only=True)``) beside the default one; ``EVENTBUS_APPEND_ONLY=1`` in the
environment puts every setting on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg

import eventbus
from benchmarks.peers.common import (
    PAYLOAD_PAD,
    env_note,
    parse_args,
    recreate_database,
    write_results,
)
from benchmarks.peers.harness import run_all
from eventbus import Bus, Context, Envelope, Event, Worker


class Tick(Event, event_type="bench.peer_tick"):
    i: int
    pad: str = PAYLOAD_PAD


class EventbusAdapter:
    def __init__(
        self, dsn: str, concurrency: int = 200, batch_size: int = 100, append_only: bool | None = None
    ) -> None:
        self.dsn = dsn
        self.append_only = append_only  # None: EVENTBUS_APPEND_ONLY decides
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.on_job: Callable[[], None] = lambda: None
        self.sleep_s = 0.0

    async def open(self) -> None:
        await recreate_database(self.dsn)
        self.bus = Bus(self.dsn, append_only=self.append_only)

        @self.bus.subscribe(Tick, name="bench")
        async def handle(event: Tick, ctx: Context) -> None:
            if self.sleep_s:
                await asyncio.sleep(self.sleep_s)
            self.on_job()

        await self.bus.migrate()
        await self.bus.register()

    async def close(self) -> None:
        await self.bus.aclose()

    async def enqueue_one(self, i: int) -> None:
        await self.bus.publish(Tick(i=i))

    async def enqueue_many(self, start: int, count: int) -> None:
        await self.bus.publish_many(Envelope(Tick(i=i)) for i in range(start, start + count))

    async def start_worker(self, on_job: Callable[[], None], sleep_s: float) -> None:
        self.on_job, self.sleep_s = on_job, sleep_s
        self.worker = Worker(
            self.bus, concurrency=self.concurrency, batch_size=self.batch_size, poll_interval_seconds=30
        )
        self.task = asyncio.create_task(self.worker.run())

    async def stop_worker(self) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, 60)

    async def remaining(self) -> int:
        report = await self.bus.status()
        return sum(r.count for r in report.rows if r.status != "completed")


async def main() -> None:
    args = parse_args("eventbus through the peer harness", "bench_eventbus")
    print(f"eventbus {eventbus.__name__} asyncpg {asyncpg.__version__} {env_note()}", flush=True)
    settings = {
        "default: concurrency=200, batch=100": lambda: EventbusAdapter(args.dsn, 200, 100),
        "small: concurrency=20, batch=10": lambda: EventbusAdapter(args.dsn, 20, 10),
        "append-only: concurrency=200, batch=100": lambda: EventbusAdapter(args.dsn, 200, 100, True),
    }
    recs = await run_all("eventbus", args, settings, lambda: EventbusAdapter(args.dsn))
    write_results(args.json, recs)


if __name__ == "__main__":
    asyncio.run(main())
