"""The audit trail's reads at size on PostgreSQL: the page's queries, their plans, and a retention pass.

    python -m benchmarks.audit --dsn postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.audit --dsn postgresql://postgres@127.0.0.1:5432/test --n 1000000 --json out.json

Fills a scratch schema with ``n`` audit rows (13 actions, 50 operators, one
a second back from now), then times each read of ``bus.audit.entries`` (the
dashboard's Audit page and ``eventbus audit`` run the same ones) as the
median of 20 runs, prints each plan's top node and index, and times one
retention pass deleting the oldest tenth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import anyio
import asyncpg

from eventbus.audit import ACTIONS
from eventbus.retention import Retention
from eventbus.testing import temporary_bus

FILL = """
INSERT INTO {s}.audit_log (at, actor, origin, action, target, filter, count, interface)
SELECT now() - (($1 - i) * interval '1 second'), 'op-' || (i % 50), '10.0.0.' || (i % 200),
       ($2::text[])[1 + i % array_length($2::text[], 1)], 'subscription s' || (i % 40), NULL, i % 7,
       CASE WHEN i % 3 = 0 THEN 'cli' ELSE 'dashboard' END
FROM generate_series(1, $1) AS i
"""
TOP = 2**63 - 1
PLANS = {
    "page": ("audit_page", (TOP, 51)),
    "by action": ("audit_page_action", (TOP, 51, "purge")),
    "by actor": ("audit_page_actor", (TOP, 51, "op-7")),
    "by action and actor": ("audit_page_actor_action", (TOP, 51, "purge", "op-7")),
    "a rare actor": ("audit_page_actor", (TOP, 51, "op-rare")),
    "an actor with no rows": ("audit_page_actor", (TOP, 51, "op-none")),
    "an action and an actor with no rows": ("audit_page_actor_action", (TOP, 51, "purge", "op-none")),
}
"""The named queries the reads run, with their parameters, to EXPLAIN."""


async def _median_ms(read: Any) -> float:
    times = []
    for _ in range(20):
        started = time.perf_counter()
        await read()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


async def run(dsn: str, n: int) -> dict[str, Any]:
    schema = f"eventbus_bench_audit_{uuid.uuid4().hex[:8]}"
    async with temporary_bus(dsn, schema=schema) as bus:
        conn = await asyncpg.connect(dsn)
        try:
            started = time.perf_counter()
            await conn.execute(FILL.format(s=schema), n, list(ACTIONS))
            await conn.execute(f"UPDATE {schema}.audit_log SET actor = 'op-rare' WHERE id % 100000 = 1")
            await conn.execute(f"ANALYZE {schema}.audit_log")
            fill = time.perf_counter() - started
            queries = bus.backend.operate.q  # type: ignore[attr-defined]
            plans = {}
            for what, (name, params) in PLANS.items():
                plans[what] = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {queries[name]}", *params)
        finally:
            await conn.close()
        mid = n // 2
        reads = {
            "page": lambda: bus.audit.entries(limit=51),
            "by action": lambda: bus.audit.entries(limit=51, action="purge"),
            "by actor": lambda: bus.audit.entries(limit=51, actor="op-7"),
            "by action and actor": lambda: bus.audit.entries(limit=51, action="purge", actor="op-7"),
            "deep page by action": lambda: bus.audit.entries(limit=51, action="purge", before=mid),
            "a rare actor": lambda: bus.audit.entries(limit=51, actor="op-rare"),
            "an actor with no rows": lambda: bus.audit.entries(limit=51, actor="op-none"),
            "an action and an actor with no rows": lambda: bus.audit.entries(
                limit=51, action="purge", actor="op-none"
            ),
        }
        timings = {k: await _median_ms(r) for k, r in reads.items()}
        cutoff = Retention(audit_retention=timedelta(seconds=n * 0.9), batch_size=1000, max_batches=1000)
        started = time.perf_counter()
        report = await bus.prune(retention=cutoff)
        prune = {"rows": report.audit_rows, "seconds": round(time.perf_counter() - started, 2)}
    top = {k: _top(json.loads(p)[0]["Plan"]) for k, p in plans.items()}
    return {"n": n, "fill_seconds": round(fill, 1), "median_ms": timings, "plans": top, "prune": prune}


def _top(plan: dict[str, Any]) -> str:
    """The plan's first node that reads the table: its type and index."""
    while "Index Name" not in plan and plan.get("Plans"):
        plan = plan["Plans"][0]
    return f"{plan['Node Type']} {plan.get('Index Name', '')}".strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--json")
    args = parser.parse_args()
    result = anyio.run(run, args.dsn, args.n)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
