"""PgQueuer peer benchmark.

    python -m benchmarks.peers.pgqueuer_bench \
        --dsn postgresql://postgres@127.0.0.1:5432/bench_pgqueuer --n 20000 --json out.json

Public API only: Queries.install / Queries.enqueue (list form for batches),
QueueManager + @entrypoint + run(batch_size=...), shutdown event to stop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta

import asyncpg
from pgqueuer import __version__ as pgq_version
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

from benchmarks.peers.common import env_note, parse_args, payload, recreate_database, write_results
from benchmarks.peers.harness import run_all

ENTRYPOINT = "bench"


def encode(i: int) -> bytes:
    return json.dumps(payload(i)).encode()


class PgQueuerAdapter:
    def __init__(self, dsn: str, batch_size: int = 10) -> None:
        self.dsn = dsn
        self.batch_size = batch_size  # QueueManager.run default is 10

    async def open(self) -> None:
        await recreate_database(self.dsn)
        self.conn = await asyncpg.connect(self.dsn)
        self.queries = Queries(AsyncpgDriver(self.conn))
        await self.queries.install()

    async def close(self) -> None:
        await self.conn.close()

    async def enqueue_one(self, i: int) -> None:
        await self.queries.enqueue(ENTRYPOINT, encode(i))

    async def enqueue_many(self, start: int, count: int) -> None:
        ids = range(start, start + count)
        await self.queries.enqueue([ENTRYPOINT] * count, [encode(i) for i in ids], [0] * count)

    async def start_worker(self, on_job: Callable[[], None], sleep_s: float) -> None:
        self.wconn = await asyncpg.connect(self.dsn)
        self.qm = QueueManager(Queries(AsyncpgDriver(self.wconn)))

        @self.qm.entrypoint(ENTRYPOINT)
        async def handle(job: Job) -> None:
            if sleep_s:
                await asyncio.sleep(sleep_s)
            on_job()

        self.task = asyncio.create_task(
            self.qm.run(batch_size=self.batch_size, dequeue_timeout=timedelta(seconds=30))
        )

    async def stop_worker(self) -> None:
        self.qm.shutdown.set()
        await asyncio.wait_for(self.task, 60)
        await self.wconn.close()

    async def remaining(self) -> int:
        return int(await self.conn.fetchval("SELECT count(*) FROM pgqueuer"))


async def main() -> None:
    args = parse_args("PgQueuer peer benchmark", "bench_pgqueuer")
    print(f"pgqueuer {pgq_version} asyncpg {asyncpg.__version__} {env_note()}", flush=True)
    settings = {
        "default: batch_size=10, unlimited concurrency": lambda: PgQueuerAdapter(args.dsn, 10),
        "tuned: batch_size=100, unlimited concurrency": lambda: PgQueuerAdapter(args.dsn, 100),
    }
    recs = await run_all("pgqueuer", args, settings, lambda: PgQueuerAdapter(args.dsn))
    write_results(args.json, recs)


if __name__ == "__main__":
    asyncio.run(main())
