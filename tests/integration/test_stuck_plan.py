"""The stuck and retrying lists read their rows through their own index, not the history around them.

On PostgreSQL, as the dashboard and the bulk walks run them (planned for the
values given); on SQLite their INDEXED BY is checked by every query preparing
(test_sqlite_queries.py).
"""

from __future__ import annotations

from ..support.plans import migrated, subscription
from .test_dead_letter_plan import TYPES

SEED = """
WITH ev AS (
    INSERT INTO {s}.events (event_type, payload)
    SELECT 'order.placed', convert_to('{{}}', 'UTF8') FROM generate_series(1, $1::int)
    RETURNING id
)
INSERT INTO {s}.deliveries (event_id, subscription_id, status, attempts, run_at, lease_until)
SELECT id, $2::int,
       CASE WHEN id % 2000 = 0 THEN 'processing' WHEN id % 2000 = 1 THEN 'pending' ELSE 'completed' END, 1,
       CASE WHEN id % 2000 = 1 THEN now() + interval '1 hour' ELSE now() - interval '1 hour' END,
       CASE WHEN id % 2000 = 0 THEN now() - interval '5 minutes' END
FROM ev
"""


async def _plans(pg_target, condition: str) -> list[str]:
    q, conn, s = await migrated(pg_target)
    try:
        sub_id = await subscription(conn, s)
        await conn.execute(SEED.format(s=s), 20_000, sub_id)
        await conn.execute(f"ANALYZE {s}.deliveries, {s}.events, {s}.subscriptions")
        await conn.execute("SET plan_cache_mode = force_custom_plan")  # as inspect_custom_plans sets
        filters = f"NULL, '{condition}'" + ", NULL" * 12
        plans = []
        for name, tail, types in [
            (f"find_deliveries_{condition}", "NULL, 51", TYPES),
            (f"count_deliveries_{condition}", "10001", TYPES.rsplit(",", 1)[0]),
            (f"delivery_ids_{condition}", "0, 1000", TYPES),
        ]:
            await conn.execute(f"PREPARE q({types}) AS {q[name]}")
            rows = await conn.fetch(f"EXPLAIN EXECUTE q({filters}, {tail})")
            await conn.execute("DEALLOCATE q")
            plans.append("\n".join(r[0] for r in rows))
        return plans
    finally:
        await conn.close()


async def test_the_stuck_list_reads_the_lease_index(pg_target) -> None:
    for plan in await _plans(pg_target, "stuck"):
        assert "deliveries_lease_until" in plan, plan
        assert "deliveries_pkey" not in plan and "Seq Scan on deliveries" not in plan, plan


async def test_the_retrying_list_reads_the_pending_rows_alone(pg_target) -> None:
    for plan in await _plans(pg_target, "retrying"):
        assert "deliveries_pending" in plan or "deliveries_claim_order" in plan, plan
        assert "deliveries_pkey" not in plan and "Seq Scan on deliveries" not in plan, plan
