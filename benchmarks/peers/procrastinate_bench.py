"""Procrastinate peer benchmark.

    python -m benchmarks.peers.procrastinate_bench \
        --dsn postgresql://postgres@127.0.0.1:5432/bench_procrastinate --n 20000 --json out.json

Public API only: App + PsycopgConnector, schema_manager.apply_schema_async,
task.defer_async / task.batch_defer_async, app.run_worker_async (stopped by
cancelling its task, as the shutdown how-to documents).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import procrastinate

from benchmarks.peers.common import env_note, parse_args, payload, recreate_database, write_results
from benchmarks.peers.harness import run_all

QUEUE = "bench"


class ProcrastinateAdapter:
    def __init__(self, dsn: str, concurrency: int = 1, pool_max: int = 4) -> None:
        self.dsn = dsn
        self.concurrency = concurrency  # worker default is 1
        self.pool_max = pool_max  # psycopg_pool default: min_size=4, max_size=min_size

    async def open(self) -> None:
        await recreate_database(self.dsn)
        connector = procrastinate.PsycopgConnector(
            conninfo=self.dsn, min_size=min(4, self.pool_max), max_size=self.pool_max
        )
        self.app = procrastinate.App(connector=connector)
        self.on_job: Callable[[], None] = lambda: None
        self.sleep_s = 0.0

        @self.app.task(name="bench", queue=QUEUE)
        async def bench(i: int, pad: str) -> None:
            if self.sleep_s:
                await asyncio.sleep(self.sleep_s)
            self.on_job()

        self.task = bench
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def enqueue_one(self, i: int) -> None:
        await self.task.defer_async(**payload(i))

    async def enqueue_many(self, start: int, count: int) -> None:
        await self.task.batch_defer_async(*(payload(i) for i in range(start, start + count)))

    async def start_worker(self, on_job: Callable[[], None], sleep_s: float) -> None:
        self.on_job, self.sleep_s = on_job, sleep_s
        self.worker = asyncio.create_task(
            self.app.run_worker_async(
                queues=[QUEUE], concurrency=self.concurrency, install_signal_handlers=False
            )
        )

    async def stop_worker(self) -> None:
        self.worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.worker, 60)

    async def remaining(self) -> int:
        rows: list[dict[str, Any]] = await self.app.connector.execute_query_all_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )
        return int(rows[0]["n"])


async def main() -> None:
    args = parse_args("Procrastinate peer benchmark", "bench_procrastinate")
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    print(f"procrastinate {version('procrastinate')} psycopg {version('psycopg')} {env_note()}")
    dsn = args.dsn
    settings = {
        "default: concurrency=1, pool 4": lambda: ProcrastinateAdapter(dsn),
        "tuned: concurrency=10, pool 12": lambda: ProcrastinateAdapter(dsn, 10, 12),
    }
    recs = await run_all("procrastinate", args, settings, lambda: ProcrastinateAdapter(dsn))
    write_results(args.json, recs)


if __name__ == "__main__":
    asyncio.run(main())
