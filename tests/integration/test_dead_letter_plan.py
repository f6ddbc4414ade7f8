"""The walk over dead letters reads their partial index, not the whole history around them."""

from __future__ import annotations

import asyncpg

SEED = """
WITH ev AS (
    INSERT INTO {s}.events (event_type, payload)
    SELECT 'order.placed', convert_to('{{"order_id":"' || g || '"}}', 'UTF8')
    FROM generate_series(1, $1::int) g
    RETURNING id
)
INSERT INTO {s}.deliveries (event_id, subscription_id, run_at, status)
SELECT id, $2::int, now() - interval '1 hour', CASE WHEN id % 1000 = 0 THEN 'dead' ELSE 'completed' END
FROM ev
"""

# The parameter types of the filtered delivery queries, in order (see inspect.filter_args).
TYPES = (
    "text, text, text, bigint, text, bigint, timestamptz, timestamptz, text[], text, bigint[], bigint, int"
)


async def _generic_plan(conn: asyncpg.Connection, sql: str, args: str) -> str:
    """The plan a pooled connection settles on after five executions (a generic one)."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE walk({TYPES}) AS {sql}")
    rows = await conn.fetch(f"EXPLAIN EXECUTE walk({args})")
    await conn.execute("DEALLOCATE walk")
    return "\n".join(r[0] for r in rows)


def _args(subscription: str = "NULL", event_type: str = "NULL", since: str = "NULL") -> str:
    """SQL literals for a walk over dead letters, from the start, 1,000 at a time."""
    return f"{subscription}, 'dead', {event_type}, NULL, NULL, NULL, {since}" + ", NULL" * 4 + ", 0, 1000"


async def test_dead_letter_walk_uses_the_dead_letter_index(pg_target) -> None:
    bus = pg_target.bus()
    try:
        await bus.migrate()
        q = bus.backend.db.q
        s = f'"{pg_target.schema}"'
        conn = await asyncpg.connect(pg_target.dsn)
        try:
            sub_id = await conn.fetchval(
                f"INSERT INTO {s}.subscriptions (name, event_type, max_attempts, lease_seconds) "
                "VALUES ('h', 'order.placed', 5, 30) RETURNING id"
            )
            await conn.execute(SEED.format(s=s), 50_000, sub_id)
            await conn.execute(f"ANALYZE {s}.deliveries, {s}.events, {s}.subscriptions")
            plans = [
                await _generic_plan(conn, q["delivery_ids_dead"], _args(**flt))
                for flt in ({"subscription": "'h'"}, {}, {"event_type": "'order.placed'", "since": "now()"})
            ]
        finally:
            await conn.close()
    finally:
        await bus.aclose()
    for plan in plans:
        assert "deliveries_dead" in plan, plan
        assert "deliveries_pkey" not in plan, plan
