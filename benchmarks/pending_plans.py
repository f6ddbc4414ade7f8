"""Plans of the queries that read the pending backlog, and the indexes over it, on PostgreSQL.

    python -m benchmarks.pending_plans --dsn postgresql://postgres@127.0.0.1:5432/bench_pending \
        --size 1000000 --out plans.txt

For each mix (``uniform``: every row priority 0, as ``benchmarks/scale.py``
loads; ``mixed``: priorities 0 to 9 in turn), ``--size`` pending deliveries
of one subscription are loaded with SQL (run_at spread over the last
``--size`` milliseconds, one row in a hundred delayed by up to an hour), then
``VACUUM ANALYZE``; then ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim, the next
due time (from the start and from a cursor), the status's oldest pending
figure, the subscriptions list and the health per subscription. Last, the
indexes of ``deliveries`` with their sizes, and the index entries one delivery
of each priority adds on its way (publish, claim, complete), counted from
``pg_stat_all_indexes``.

Run it with ``PYTHONPATH`` pointing at another tree to see that tree's
queries and migrations. The database is recreated (its name must start with
``bench_``).
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.peers.common import PAYLOAD_PAD, recreate_database
from eventbus import Bus, Context, Envelope, Event
from eventbus.backends.ports.delivery import Completion

SCHEMA = "eventbus"


class PendingTick(Event, event_type="bench.pending_tick"):
    i: int
    pad: str = PAYLOAD_PAD


LOAD = f"""
WITH ev AS (
    INSERT INTO {SCHEMA}.events (event_type, payload, priority)
    SELECT 'bench.pending_tick', convert_to('{{"i":' || g || ',"pad":"{PAYLOAD_PAD}"}}', 'UTF8'),
           CASE WHEN $3 THEN g % 10 ELSE 0 END
    FROM generate_series($4::int, $4::int + $1::int - 1) g
    RETURNING id, priority
)
INSERT INTO {SCHEMA}.deliveries (event_id, subscription_id, run_at, priority_wait)
SELECT id, $2::int,
       CASE WHEN id % 100 = 0 THEN now() + (id % 3600) * interval '1 second'
            ELSE now() - ($5::bigint - id) * interval '1 millisecond' END,
       priority * $6::float8
FROM ev
"""

INDEXES = f"""
SELECT i.relname AS index, pg_get_indexdef(i.oid) AS definition,
       pg_size_pretty(pg_relation_size(i.oid)) AS size
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = '{SCHEMA}.deliveries'::regclass ORDER BY 1
"""


async def explain(conn: asyncpg.Connection, sql: str, *args: Any) -> str:
    tx = conn.transaction()
    await tx.start()
    try:
        rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args)
    finally:
        await tx.rollback()
    return "\n".join(r[0] for r in rows)


ENTRIES = """
SELECT coalesce(sum(CASE WHEN i.tids IS NULL THEN 1 ELSE cardinality(i.tids) END), 0)::bigint
FROM generate_series(1, (pg_relation_size($1::regclass) / 8192)::int - 1) b
CROSS JOIN LATERAL bt_page_stats($1::text, b) s
CROSS JOIN LATERAL bt_page_items($1::text, b) i
WHERE s.type = 'l' AND NOT (s.btpo_next <> 0 AND i.itemoffset = 1)
"""


async def entries_per_delivery(dsn: str, priority: int, n: int = 100) -> dict[str, Any]:
    """Index entries (live and dead, read from the btree pages with pageinspect) that ``n``
    deliveries of ``priority`` leave in each index of deliveries on their way: published,
    claimed, completed. Autovacuum is off for the table meanwhile."""
    await recreate_database(dsn)
    bus = Bus(dsn, schema=SCHEMA)

    @bus.subscribe(PendingTick, name="pending")
    async def handle(event: PendingTick, ctx: Context) -> None:
        pass

    await bus.migrate()
    sub_id = (await bus.register())["pending"]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        await conn.execute(f"ALTER TABLE {SCHEMA}.deliveries SET (autovacuum_enabled = false)")
        names = [r[0] for r in await conn.fetch(INDEXES)]
        counts: dict[str, list[int]] = {name: [] for name in names}

        async def count() -> None:
            for name in names:
                counts[name].append(await conn.fetchval(ENTRIES, f"{SCHEMA}.{name}"))

        await count()
        await bus.publish_many([Envelope(PendingTick(i=i), priority=priority) for i in range(n)])
        await count()
        store = bus.backend.deliveries
        claimed = await store.claim(sub_id, n, 30.0, str(uuid.uuid4()))
        await count()
        await store.complete([Completion(c.id, c.lease_token) for c in claimed])
        await count()
    finally:
        await conn.close()
        await bus.aclose()
    out: dict[str, Any] = {}
    for name, (c0, c1, c2, c3) in counts.items():
        if c3 > c0:  # entries added by the publish, the claim and the completion
            out[name] = (c3 - c0) / n
            out[f"{name} (publish, claim, complete)"] = (c1 - c0, c2 - c1, c3 - c2)
    out["total"] = sum(v for k, v in out.items() if "(" not in k)
    out["total at publish"] = sum((counts[k][1] - counts[k][0]) / n for k in counts)
    return out


async def case(dsn: str, size: int, mixed: bool, out: list[str]) -> None:
    await recreate_database(dsn)
    bus = Bus(dsn, schema=SCHEMA)

    @bus.subscribe(PendingTick, name="pending")
    async def handle(event: PendingTick, ctx: Context) -> None:
        pass

    await bus.migrate()
    sub_id = (await bus.register())["pending"]
    q = bus.backend.db.q  # type: ignore[attr-defined]
    step = bus.backend.db.priority_step  # type: ignore[attr-defined]
    conn = await asyncpg.connect(dsn)
    try:
        for start in range(0, size, 250_000):
            await conn.execute(LOAD, min(250_000, size - start), sub_id, mixed, start + 1, size, step)
        await conn.execute("VACUUM ANALYZE")
        cursor = await conn.fetchval(
            f"SELECT run_at FROM {SCHEMA}.deliveries ORDER BY id LIMIT 1 OFFSET $1", size // 2
        )
        token, worker = uuid.uuid4(), uuid.uuid4()
        probes = [
            ("claim", q["claim"], (sub_id, 100, 30.0, token, worker, 9 * step)),
            ("next_run_in (from the start)", q["next_run_in"], (sub_id, None)),
            ("next_run_in (from a cursor)", q["next_run_in"], (sub_id, cursor)),
            ("status_oldest_pending", q["status_oldest_pending"], ()),
            ("subscriptions", q["subscriptions"], ()),
            ("health_subscriptions", q["health_subscriptions"], ()),
        ]
        out.append(f"## {'mixed priorities 0-9' if mixed else 'priority 0'}, {size:,} pending\n")
        for title, sql, args in probes:
            plan = await explain(conn, sql, *args)
            out.append(f"### {title}\n\n```\n{plan}\n```\n")
            print(title, plan.splitlines()[-1], flush=True)
        out.append("### indexes of deliveries\n")
        for r in await conn.fetch(INDEXES):
            out.append(f"- `{r['index']}` {r['size']}: `{r['definition']}`")
        out.append("")
    finally:
        await conn.close()
        await bus.aclose()


async def main(args: argparse.Namespace) -> str:
    out: list[str] = []
    out.append("## index entries per delivery (published, claimed, completed)\n")
    for priority in (0, 5):
        found = await entries_per_delivery(args.dsn, priority)
        out.append(f"- priority {priority}: {found}")
        print(f"priority {priority}:", found, flush=True)
    out.append("")
    for mixed in (False, True):
        await case(args.dsn, args.size, mixed, out)
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/bench_pending")
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    text = asyncio.run(main(args))
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
