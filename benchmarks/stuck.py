"""The stuck and retrying lists at scale: a few such deliveries behind many completed ones.

    python -m benchmarks.stuck --backend postgres --dsn postgresql://postgres@127.0.0.1:5432/test \
        --rows 1000000 --json benchmarks/results/stuck_postgres.json
    python -m benchmarks.stuck --backend sqlite --rows 1000000

Loads ``--rows`` deliveries with SQL: the five oldest processing with their
lease run out (stuck), the next five pending after a failure with their next
attempt an hour ahead (retrying), the rest completed: the worst case for a
newest-first walk. Then times (median of ``--runs``) what the dashboard's
lists and the bulk actions read for each condition: the first page, the
capped count and one batch of the id walk. On PostgreSQL the data goes to the
schema ``bench_stuck`` (dropped first and after); on SQLite to a temporary file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from eventbus import Bus
from eventbus.types import DeliveryFilter

SCHEMA = "bench_stuck"

PG_LOAD = """
WITH ev AS (
    INSERT INTO {s}.events (event_type, payload)
    SELECT 'order.placed', convert_to('{{}}', 'UTF8') FROM generate_series(1, $1::int)
    RETURNING id
)
INSERT INTO {s}.deliveries (event_id, subscription_id, status, attempts, run_at, lease_until, updated_at)
SELECT id, $2::int,
       CASE WHEN id <= 5 THEN 'processing' WHEN id <= 10 THEN 'pending' ELSE 'completed' END, 1,
       CASE WHEN id > 5 AND id <= 10 THEN now() + interval '1 hour' ELSE now() - interval '1 hour' END,
       CASE WHEN id <= 5 THEN now() - interval '5 minutes' END, now()
FROM ev
"""

SQLITE_EVENTS = """
WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?)
INSERT INTO events (event_type, payload, deliver_at, created_at) SELECT 'order.placed', '{}', ?, ? FROM g
"""
SQLITE_DELIVERIES = """
INSERT INTO deliveries (event_id, subscription_id, status, attempts, run_at, lease_until, updated_at)
SELECT id, 1, CASE WHEN id <= 5 THEN 'processing' WHEN id <= 10 THEN 'pending' ELSE 'completed' END, 1,
       CASE WHEN id > 5 AND id <= 10 THEN ?1 + 3600 ELSE ?1 - 3600 END,
       CASE WHEN id <= 5 THEN ?1 - 300 END, ?1
FROM events
"""


async def _load_postgres(dsn: str, rows: int) -> Bus:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    finally:
        await conn.close()
    bus = Bus(dsn, schema=SCHEMA)
    await bus.migrate()
    conn = await asyncpg.connect(dsn)
    try:
        sub = await conn.fetchval(
            f"INSERT INTO {SCHEMA}.subscriptions (name, event_type, max_attempts, lease_seconds) "
            "VALUES ('h', 'order.placed', 5, 30) RETURNING id"
        )
        await conn.execute(PG_LOAD.format(s=SCHEMA), rows, sub)
        await conn.execute(f"VACUUM ANALYZE {SCHEMA}.deliveries")
        await conn.execute(f"ANALYZE {SCHEMA}.events")
    finally:
        await conn.close()
    return bus


async def _load_sqlite(folder: str, rows: int) -> Bus:
    path = os.path.join(folder, "stuck.db")
    bus = Bus(f"sqlite:///{path}")
    await bus.migrate()
    now = time.time()
    db = sqlite3.connect(path)
    try:
        db.execute(
            "INSERT INTO subscriptions (name, event_type, max_attempts, lease_seconds, created_at, "
            "last_seen_at) VALUES ('h', 'order.placed', 5, 30, ?, ?)",
            (now, now),
        )
        db.execute(SQLITE_EVENTS, (rows, now, now))
        db.execute(SQLITE_DELIVERIES, (now,))
        db.commit()
        db.execute("ANALYZE")
    finally:
        db.close()
    return bus


async def _median_ms(run: Callable[[], Awaitable[Any]], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await run()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


async def _measure(bus: Bus, runs: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for condition in ("stuck", "retrying"):
        flt = DeliveryFilter(condition=condition)
        assert len(await bus.find_deliveries(flt, limit=51)) == 5

        async def page(f: DeliveryFilter = flt) -> Any:
            return await bus.find_deliveries(f, limit=51)

        async def count(f: DeliveryFilter = flt) -> Any:
            return await bus.count_deliveries(f)

        async def walk(f: DeliveryFilter = flt) -> Any:
            return await bus.backend.inspect.delivery_ids(f, 1000, 0)

        out[condition] = {
            "first_page_ms": await _median_ms(page, runs),
            "count_ms": await _median_ms(count, runs),
            "walk_batch_ms": await _median_ms(walk, runs),
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--dsn", default=os.environ.get("EVENTBUS_TEST_DSN", ""))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.backend == "postgres":
            bus = await _load_postgres(args.dsn, args.rows)
        else:
            bus = await _load_sqlite(folder, args.rows)
        try:
            result = {
                "backend": args.backend,
                "rows": args.rows,
                "runs": args.runs,
                **await _measure(bus, args.runs),
            }
        finally:
            await bus.aclose()
    if args.backend == "postgres":
        conn = await asyncpg.connect(args.dsn)
        try:
            await conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
        finally:
            await conn.close()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
