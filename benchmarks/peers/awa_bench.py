"""Awa (awa-pg, Rust core with Python bindings) peer benchmark.

    python -m benchmarks.peers.awa_bench \
        --dsn postgresql://postgres@127.0.0.1:5432/bench_awa --n 20000 --json out.json

Public API only: AsyncClient.migrate + install_queue_storage (needed before the
COPY enqueue path), insert / enqueue_many_copy, @client.task, start / shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import awa

from benchmarks.peers.common import env_note, parse_args, payload, recreate_database, write_results
from benchmarks.peers.harness import run_all

QUEUE = "bench"


@dataclass
class BenchArgs:
    i: int
    pad: str


class AwaAdapter:
    def __init__(self, dsn: str, queue_config: tuple[str, int] | dict[str, Any]) -> None:
        self.dsn = dsn
        self.queue_config = queue_config

    async def open(self) -> None:
        await recreate_database(self.dsn)
        self.client = awa.AsyncClient(self.dsn, max_connections=10)
        await self.client.migrate()
        await self.client.install_queue_storage()
        self.on_job: Callable[[], None] = lambda: None
        self.sleep_s = 0.0

        @self.client.task(BenchArgs, queue=QUEUE)
        async def bench(job: awa.Job[BenchArgs]) -> None:
            if self.sleep_s:
                await asyncio.sleep(self.sleep_s)
            self.on_job()

    async def close(self) -> None:
        await self.client.close()

    async def enqueue_one(self, i: int) -> None:
        await self.client.insert(BenchArgs(**payload(i)), queue=QUEUE)

    async def enqueue_many(self, start: int, count: int) -> None:
        jobs = [BenchArgs(**payload(i)) for i in range(start, start + count)]
        await self.client.enqueue_many_copy(jobs, queue=QUEUE)

    async def start_worker(self, on_job: Callable[[], None], sleep_s: float) -> None:
        self.on_job, self.sleep_s = on_job, sleep_s
        await self.client.start([self.queue_config])

    async def stop_worker(self) -> None:
        # Read the backlog while the runtime is still up: health_check() is cheap,
        # whereas queue_stats() took > 30 s here even after a 20k drain.
        try:
            health = await asyncio.wait_for(self.client.health_check(), 10)
            self.left = health.queues[QUEUE].available
        except (TimeoutError, KeyError):
            self.left = -1  # unknown
        await self.client.shutdown(timeout_ms=10_000)

    async def remaining(self) -> int:
        """Jobs still claimable when the worker stopped (-1 if unknown)."""
        return self.left


async def main() -> None:
    args = parse_args("Awa peer benchmark", "bench_awa")
    print(f"awa-pg {version('awa-pg')} {env_note()}", flush=True)
    dsn = args.dsn
    tuned = {"name": QUEUE, "max_workers": 50, "claimers": 2, "claim_batch_size": 100}
    settings = {
        "default: max_workers=50 (documented QueueConfig default)": lambda: AwaAdapter(dsn, (QUEUE, 50)),
        "tuned: max_workers=50 claimers=2 claim_batch_size=100": lambda: AwaAdapter(dsn, tuned),
    }
    recs = await run_all("awa", args, settings, lambda: AwaAdapter(dsn, (QUEUE, 50)))
    write_results(args.json, recs)


if __name__ == "__main__":
    asyncio.run(main())
