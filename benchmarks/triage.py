"""The triage page at scale on PostgreSQL: dead letters grouped by cause among many completed deliveries.

    python -m benchmarks.triage --dsn postgresql://postgres@127.0.0.1:5432/bench_triage \
        --dead 100000 --completed 1000000 --json benchmarks/results/triage.json

Loads ``--completed`` completed deliveries, ``--dead`` dead letters and
``--failing`` pending deliveries waiting to retry (SQL,
then ``VACUUM ANALYZE``), their last errors in five shapes with varying ids,
numbers and quoted strings; then times (median of ``--runs``) the grouping the
page runs (``error_groups`` over the newest ``--sample``), the whole page
through the ASGI app, a group's confirmation count (capped at 10,000 as the
page's), and a substring filter, and prints the plans of the reads with
``EXPLAIN (ANALYZE, BUFFERS)``. The database name must start with ``bench_``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmarks.peers.common import PAYLOAD_PAD, recreate_database
from eventbus import Bus, Context, Event
from eventbus.backends.postgres.inspect import filter_args
from eventbus.triage import error_groups, failing
from eventbus.types import DeliveryFilter
from eventbus.web import create_app

SCHEMA = "eventbus"


class TriageTick(Event, event_type="bench.triage_tick"):
    i: int
    pad: str = PAYLOAD_PAD


LOAD = f"""
WITH ev AS (
    INSERT INTO {SCHEMA}.events (event_type, payload)
    SELECT 'bench.triage_tick', convert_to('{{"i":' || g || ',"pad":"{PAYLOAD_PAD}"}}', 'UTF8')
    FROM generate_series($4::int, $4::int + $1::int - 1) g
    RETURNING id
)
INSERT INTO {SCHEMA}.deliveries (event_id, subscription_id, status, attempts, last_error, updated_at)
SELECT id, $2::int, $3::text, CASE WHEN $3 = 'dead' THEN 5 ELSE 1 END,
       CASE WHEN $3 = 'completed' THEN NULL
            WHEN id % 5 = 0 THEN 'KeyError: order ' || id || ' not found'
            WHEN id % 5 = 1 THEN 'TimeoutError: gateway timed out after ' || (id % 30) || 's'
            WHEN id % 5 = 2 THEN 'ValueError: card ''c-' || md5(id::text) || ''' declined'
            WHEN id % 5 = 3 THEN 'ConnectionError: host 10.0.' || (id % 255) || '.1 refused'
            ELSE 'RuntimeError: payment ' || gen_random_uuid() || ' in state 0x' || to_hex(id) END,
       now() - (id % 86400) * interval '1 second'
FROM ev
"""


async def load(dsn: str, completed: int, dead: int, failing: int) -> tuple[Bus, float]:
    await recreate_database(dsn)
    bus = Bus(dsn, schema=SCHEMA)

    @bus.subscribe(TriageTick, name="triage")
    async def handle(event: TriageTick, ctx: Context) -> None:
        pass

    await bus.migrate()
    sub_id = (await bus.register())["triage"]
    conn = await asyncpg.connect(dsn)
    try:
        t0, start = time.perf_counter(), 1
        # Dead and failing first: the oldest rows, under all the completed
        # ones, so a newest-first walk of the primary key would cross them all.
        for status, size in (("dead", dead), ("pending", failing), ("completed", completed)):
            for offset in range(0, size, 250_000):
                n = min(250_000, size - offset)
                await conn.execute(LOAD, n, sub_id, status, start)
                start += n
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
        return bus, time.perf_counter() - t0
    finally:
        await conn.close()


async def median_ms(runs: int, call: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


async def plan(bus: Bus, dsn: str, name: str, flt: DeliveryFilter, *tail: Any) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            query = bus.backend.db.q[name]  # type: ignore[attr-defined]
            rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + query, *filter_args(flt), *tail)
        return "\n".join(r[0] for r in rows)
    finally:
        await conn.close()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    bus, load_s = await load(args.dsn, args.completed, args.dead, args.failing)
    dead = DeliveryFilter(status="dead")
    refused = DeliveryFilter(status="dead", error_contains="refused")
    found = await error_groups(bus, dead, sample=args.sample)
    group = found.groups[0]
    app = create_app(bus, page_size=50)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as web:
        page = await median_ms(args.runs, lambda: web.get("/triage"))
        query = {"error_contains": "refused"}
        retrying = await median_ms(args.runs, lambda: web.get("/triage", params={"kind": "failing"}))
        filtered = await median_ms(args.runs, lambda: web.get("/triage", params=query))
    result = {
        "completed": args.completed, "dead": args.dead, "sample": args.sample,
        "load_seconds": round(load_s, 1),
        "groups": [(g.message, g.count) for g in found.groups], "capped": found.capped,
        "error_groups_ms": await median_ms(args.runs, lambda: error_groups(bus, dead, sample=args.sample)),
        "page_ms": page, "page_error_contains_ms": filtered,
        "failing": args.failing, "page_failing_ms": retrying,
        "group_count_ms": await median_ms(args.runs, lambda: bus.count_deliveries(group.filter, cap=10_000)),
        "plans": {
            "sample": await plan(bus, args.dsn, "find_deliveries_dead", dead, None, args.sample + 1),
            "sample_error_contains": await plan(
                bus, args.dsn, "find_deliveries_dead", refused, None, args.sample + 1
            ),
            "failing_sample": await plan(
                bus, args.dsn, "find_deliveries", failing(DeliveryFilter()), None, args.sample + 1
            ),
            "group_count": await plan(bus, args.dsn, "count_deliveries_dead", group.filter, 10_001),
            "group_walk": await plan(bus, args.dsn, "delivery_ids_dead", group.filter, 0, 1000),
        },
    }  # fmt: skip
    await bus.aclose()
    return result


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/bench_triage")
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--completed", type=int, default=1_000_000)
    parser.add_argument("--failing", type=int, default=20_000, help="pending deliveries with an error")
    parser.add_argument("--sample", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(main(args))
    for name, text in result["plans"].items():
        print(f"--- {name}\n{text}")
    print(json.dumps({k: v for k, v in result.items() if k != "plans"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    cli()
