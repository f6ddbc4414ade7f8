"""Publish rates of eventbus and PgQueuer, side by side in one process, alternating.

    python -m benchmarks.peers.publish_side_by_side --runs 3 --n 2000 --concurrency 1,8,64,256

Each round measures every system once per concurrency level, in alternating
order, on databases recreated for the round; the table gives the median and
the min-max over the rounds. ``concurrency`` tasks each publish one event at a
time (awaited) until ``n`` are published: 1 is the single-publish case.

Systems: ``eventbus`` (default: concurrent publishes coalesced), ``eventbus-nc``
(``Bus(coalesce_publishes=False)``: one transaction per call), ``pgqueuer``
(``Queries.enqueue`` on one connection for 1 task, on an asyncpg pool of 10,
eventbus's default pool size, for more). ``--eventbus-dsn sqlite:///path`` measures the
embedded backend instead (with ``--systems eventbus,eventbus-nc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.queries import Queries

from benchmarks.peers.common import now, payload, recreate_database
from benchmarks.peers.eventbus_bench import Tick
from eventbus import Bus

Publish = Callable[[int], Awaitable[Any]]


async def drive(publish: Publish, n: int, concurrency: int) -> float:
    """``concurrency`` tasks publish one event at a time until ``n`` are done; events/s."""
    counter = iter(range(n))

    async def one_task() -> None:
        for i in counter:
            await publish(i)

    t0 = now()
    await asyncio.gather(*(one_task() for _ in range(concurrency)))
    return n / (now() - t0)


async def eventbus_rate(dsn: str, n: int, concurrency: int, coalesce: bool) -> float:
    if dsn.startswith("sqlite:///"):  # a fresh file (with its WAL) for each run
        for suffix in ("", "-wal", "-shm"):
            Path(dsn.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)  # noqa: ASYNC240
    else:
        await recreate_database(dsn)
    bus = Bus(dsn, **({} if coalesce else {"coalesce_publishes": False}))
    bus.subscribe(Tick, name="bench")(_noop)
    try:
        await bus.migrate()
        await bus.register()
        await drive(lambda i: bus.publish(Tick(i=i)), 50, min(concurrency, 50))  # warm the pool
        return await drive(lambda i: bus.publish(Tick(i=i)), n, concurrency)
    finally:
        await bus.aclose()


async def _noop(event: Tick, ctx: Any) -> None:
    return None


async def pgqueuer_rate(dsn: str, n: int, concurrency: int) -> float:
    await recreate_database(dsn)
    conn = await asyncpg.connect(dsn)
    pool = None
    try:
        await Queries(AsyncpgDriver(conn)).install()
        if concurrency == 1:
            queries = Queries(AsyncpgDriver(conn))
        else:
            pool = await asyncpg.create_pool(dsn, min_size=10, max_size=10)
            queries = Queries(AsyncpgPoolDriver(pool))

        def publish(i: int) -> Awaitable[Any]:
            return queries.enqueue("bench", json.dumps(payload(i)).encode())

        await drive(publish, 50, min(concurrency, 50))
        return await drive(publish, n, concurrency)
    finally:
        if pool is not None:
            await pool.close()
        await conn.close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    base = "postgresql://postgres@127.0.0.1:5432/"
    p.add_argument("--eventbus-dsn", default=base + "bench_eventbus_pub")
    p.add_argument("--pgqueuer-dsn", default=base + "bench_pgqueuer_pub")
    p.add_argument("--n", type=int, default=2000, help="events per measurement")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrency", default="1", help="comma list of concurrent publisher counts")
    p.add_argument("--systems", default="eventbus,eventbus-nc,pgqueuer")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    systems = args.systems.split(",")
    runners: dict[str, Callable[[int], Awaitable[float]]] = {
        "eventbus": lambda c: eventbus_rate(args.eventbus_dsn, args.n, c, True),
        "eventbus-nc": lambda c: eventbus_rate(args.eventbus_dsn, args.n, c, False),
        "pgqueuer": lambda c: pgqueuer_rate(args.pgqueuer_dsn, args.n, c),
    }
    rates: dict[tuple[str, int], list[float]] = {(s, c): [] for s in systems for c in levels}
    for r in range(args.runs):
        order = systems if r % 2 == 0 else systems[::-1]
        for c in levels:
            for s in order:
                rate = await runners[s](c)
                rates[(s, c)].append(rate)
                load = os.getloadavg()[0]
                print(f"run {r} {s} concurrency={c}: {rate:,.0f}/s load1={load:.2f}", flush=True)
    print_table(rates, args.n)
    if args.json:
        write_json(args.json, rates, args.n)


def write_json(path: str, rates: dict[tuple[str, int], list[float]], n: int) -> None:
    out = [{"system": s, "concurrency": c, "n": n, "runs": v} for (s, c), v in rates.items()]
    Path(path).write_text(json.dumps(out, indent=2) + "\n")


def print_table(rates: dict[tuple[str, int], list[float]], n: int) -> None:
    print("\n| system | publishers | n | median events/s | range | vs pgqueuer (median) |")
    print("|---|---|---|---|---|---|")
    for (s, c), v in rates.items():
        ref = rates.get(("pgqueuer", c))
        ratio = f"{statistics.median(v) / statistics.median(ref):.2f}x" if ref else ""
        print(
            f"| {s} | {c} | {n:,} | {statistics.median(v):,.0f} | {min(v):,.0f} - {max(v):,.0f} | {ratio} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
