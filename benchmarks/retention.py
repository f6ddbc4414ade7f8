"""Retention under load: drain throughput with pruning against without, and table size over time.

    python -m benchmarks.retention --dsn postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.retention --dsn sqlite:///bench.db

A worker serves one subscription while rounds of events are published at a
steady pace, first keeping every row, then with a retention of 0 seconds and
a pruning pass every ``--interval`` seconds. Reported per mode: deliveries/s
while draining (pauses between rounds excluded), the deliveries left and the
tables' size after each round (PostgreSQL: every table of the schema with its
indexes, which shrinks only once VACUUM makes the space reusable; SQLite: the
file and its WAL).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from typing import Any

import anyio

from eventbus import Bus, Context, Envelope, Retention, Worker
from eventbus.testing import BenchEvent, temporary_bus


async def _size(bus: Bus) -> int:
    backend: Any = bus.backend
    if bus.backend.kind == "sqlite":
        files = [anyio.Path(backend.db.path), anyio.Path(backend.db.path + "-wal")]
        return sum([(await f.stat()).st_size for f in files if await f.exists()])
    async with backend.db.conn() as conn:
        return int(
            await conn.fetchval(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND c.relkind = 'r'",
                backend.schema_name,
            )
        )


async def _vacuum(bus: Bus) -> None:
    """What autovacuum does in a long run (it may not get to a scratch schema in minutes)."""
    backend: Any = bus.backend
    if bus.backend.kind != "postgres":
        return
    async with backend.db.conn() as conn:
        for table in ("events", "deliveries", "delivery_attempts"):
            await conn.execute(f'VACUUM "{backend.schema_name}".{table}')


async def _rows(bus: Bus) -> int:
    report = await bus.status()
    return sum(r.count for r in report.rows)


async def run_mode(
    dsn: str, prune: bool, rounds: int, per_round: int, pause: float, interval: float, vacuum_every: int
) -> dict[str, Any]:
    """One mode (keep every row, or prune) on a scratch schema or file."""
    pool: dict[str, Any] = {} if dsn.startswith("sqlite:") else {"max_pool_size": 8}
    async with temporary_bus(dsn, **pool) as bus:
        return await _rounds(bus, prune, rounds, per_round, pause, interval, vacuum_every)


async def _rounds(
    bus: Bus, prune: bool, rounds: int, per_round: int, pause: float, interval: float, vacuum_every: int
) -> dict[str, Any]:
    """Publish ``rounds`` of ``per_round`` events to a running worker, measuring after each."""
    if prune:
        bus.retention = Retention(
            completed_retention=timedelta(0), interval=timedelta(seconds=interval), batch_size=1000
        )
    else:
        bus.retention = Retention(interval=None)

    @bus.subscribe(BenchEvent, name="bench.retention")
    async def handle(event: BenchEvent, ctx: Context) -> None:
        pass

    worker = Worker(bus, poll_interval_seconds=0.2)
    sizes: list[int] = []
    rows: list[int] = []
    busy = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.5)
        for r in range(rounds):
            started = time.perf_counter()
            for start in range(0, per_round, 1000):
                await bus.publish_many(
                    [Envelope(BenchEvent(n=r * per_round + start + i)) for i in range(1000)]
                )
            while worker.processed < (r + 1) * per_round:  # noqa: ASYNC110 (a benchmark's poll)
                await anyio.sleep(0.01)
            busy += time.perf_counter() - started
            if vacuum_every and (r + 1) % vacuum_every == 0:
                await _vacuum(bus)
            sizes.append(await _size(bus))
            rows.append(await _rows(bus))
            await anyio.sleep(pause)
        worker.stop()
    return {
        "mode": "prune" if prune else "keep",
        "deliveries_per_second": rounds * per_round / busy,
        "size_after_round_bytes": sizes,
        "deliveries_after_round": rows,
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for prune in (False, True):
        row = await run_mode(
            args.dsn, prune, args.rounds, args.per_round, args.pause, args.interval, args.vacuum_every
        )
        print(row)
        out.append(row)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=10_000)
    parser.add_argument("--pause", type=float, default=1.0, help="Seconds between rounds.")
    parser.add_argument("--interval", type=float, default=2.0, help="Seconds between pruning passes.")
    parser.add_argument("--vacuum-every", type=int, default=0, help="PostgreSQL: VACUUM every N rounds.")
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    rows = anyio.run(main, ns)
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(rows, f, indent=2)
