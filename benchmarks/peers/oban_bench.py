"""Oban (oban-py, the Python port of Elixir's Oban) peer benchmark. Needs Python >= 3.12.

    /work/benchvenv312/bin/python -m benchmarks.peers.oban_bench \
        --dsn postgresql://postgres@127.0.0.1:5432/bench_oban --n 20000 --json out.json

Public API only: Oban.create_pool, oban.schema.install, @worker, Worker.new,
Oban.enqueue / enqueue_many (client-mode instance), a server-mode instance with
queues={"bench": limit} started with start() and stopped with stop().
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from oban import Job, Oban, schema, worker

from benchmarks.peers.common import env_note, parse_args, payload, recreate_database, write_results
from benchmarks.peers.harness import run_all

QUEUE = "bench"
HOOK: dict[str, Any] = {"on_job": lambda: None, "sleep_s": 0.0}  # set per worker start


@worker(queue=QUEUE)
class BenchWorker:
    async def process(self, job: Job) -> None:
        if HOOK["sleep_s"]:
            await asyncio.sleep(HOOK["sleep_s"])
        HOOK["on_job"]()


class ObanAdapter:
    def __init__(self, dsn: str, limit: int = 10) -> None:
        self.dsn = dsn
        self.limit = limit  # per-queue concurrency; also the most one fetch claims

    async def open(self) -> None:
        await recreate_database(self.dsn)
        self.pool = await Oban.create_pool(self.dsn)  # defaults: min 1, max 10
        await schema.install(self.pool)
        self.client = Oban(pool=self.pool, name="bench-client")  # client mode: enqueue only

    async def close(self) -> None:
        await self.pool.close()

    async def enqueue_one(self, i: int) -> None:
        await self.client.enqueue(BenchWorker.new(payload(i)))

    async def enqueue_many(self, start: int, count: int) -> None:
        await self.client.enqueue_many([BenchWorker.new(payload(i)) for i in range(start, start + count)])

    async def start_worker(self, on_job: Callable[[], None], sleep_s: float) -> None:
        HOOK.update(on_job=on_job, sleep_s=sleep_s)
        self.server = Oban(pool=self.pool, name="bench-worker", queues={QUEUE: self.limit})
        await self.server.start()

    async def stop_worker(self) -> None:
        await asyncio.wait_for(self.server.stop(), 60)

    async def remaining(self) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM oban_jobs WHERE state NOT IN ('completed', 'discarded', 'cancelled')"
            )
            row = await cur.fetchone()
        return int(row[0]) if row else -1


async def main() -> None:
    args = parse_args("Oban (Python) peer benchmark", "bench_oban")
    print(f"oban {version('oban')} psycopg {version('psycopg')} {env_note()}", flush=True)
    dsn = args.dsn
    settings = {
        "default: queues={bench: 10}": lambda: ObanAdapter(dsn, 10),
        "tuned: queues={bench: 100}": lambda: ObanAdapter(dsn, 100),
    }
    recs = await run_all("oban", args, settings, lambda: ObanAdapter(dsn))
    write_results(args.json, recs)


if __name__ == "__main__":
    asyncio.run(main())
