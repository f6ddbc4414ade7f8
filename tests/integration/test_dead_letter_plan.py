"""Dead letters are read through their partial index, not the whole history around them.

The walk of a bulk replay or purge, and the dashboard's list and count: on
PostgreSQL under the generic plan a pooled connection settles on, on SQLite
under its one plan per statement.
"""

from __future__ import annotations

import json
import sqlite3

import asyncpg
import pytest

from eventbus.types import DeliveryFilter

from ..support.plans import migrated, rows_read, subscription

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
    "text, text, text, bigint, text, bigint, timestamptz, timestamptz, text[], text, bigint[], "
    "text, text, text, bigint, int"
)


async def _generic_plan(conn: asyncpg.Connection, sql: str, args: str, types: str = TYPES) -> str:
    """The plan a pooled connection settles on after five executions (a generic one)."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE walk({types}) AS {sql}")
    rows = await conn.fetch(f"EXPLAIN EXECUTE walk({args})")
    await conn.execute("DEALLOCATE walk")
    return "\n".join(r[0] for r in rows)


def _args(subscription: str = "NULL", event_type: str = "NULL", since: str = "NULL") -> str:
    """SQL literals for a walk over dead letters, from the start, 1,000 at a time."""
    return f"{subscription}, 'dead', {event_type}, NULL, NULL, NULL, {since}" + ", NULL" * 7 + ", 0, 1000"


FILTERS: tuple[dict[str, str], ...] = (
    {"subscription": "'h'"},
    {},
    {"event_type": "'order.placed'", "since": "now()"},
)
DEAD = DeliveryFilter(status="dead")


async def _seeded(pg_target) -> tuple[dict[str, str], asyncpg.Connection]:
    """The queries and a connection to 50,000 deliveries, one in a thousand dead."""
    q, conn, s = await migrated(pg_target)
    sub_id = await subscription(conn, s)
    await conn.execute(SEED.format(s=s), 50_000, sub_id)
    await conn.execute(f"ANALYZE {s}.deliveries, {s}.events, {s}.subscriptions")
    return q, conn


def _reads_the_dead_letters_alone(plan: str) -> None:
    assert "deliveries_dead" in plan, plan
    assert "deliveries_pkey" not in plan and "Seq Scan on deliveries" not in plan, plan


async def test_dead_letter_walk_uses_the_dead_letter_index(pg_target) -> None:
    q, conn = await _seeded(pg_target)
    try:
        plans = [await _generic_plan(conn, q["delivery_ids_dead"], _args(**flt)) for flt in FILTERS]
    finally:
        await conn.close()
    for plan in plans:
        _reads_the_dead_letters_alone(plan)


async def test_dead_letter_list_and_count_use_the_dead_letter_index(pg_target) -> None:
    """The dashboard's /dead page (and /deliveries?status=dead) under a generic plan."""
    q, conn = await _seeded(pg_target)
    count_types = TYPES.rsplit(",", 1)[0]
    try:
        plans = []
        for flt in FILTERS:
            listing = _args(**flt).replace(", 0, 1000", ", NULL, 51")  # the first page, 50 rows and one more
            plans.append(await _generic_plan(conn, q["find_deliveries_dead"], listing))
            counting = _args(**flt).replace(", 0, 1000", ", 10001")
            plans.append(await _generic_plan(conn, q["count_deliveries_dead"], counting, count_types))
    finally:
        await conn.close()
    for plan in plans:
        _reads_the_dead_letters_alone(plan)


async def test_dashboard_reads_are_planned_for_their_values(pg_target) -> None:
    """A pooled connection that settled on generic plans still plans the catch-all filter per call.

    A generic plan cannot drop the conditions left NULL and joins the whole
    events table first; planned for the values, the newest page is a short
    backward walk of the primary key.
    """
    q, conn = await _seeded(pg_target)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        async with conn.transaction(readonly=True):
            await conn.execute(q["inspect_timeout"])  # what every dashboard read runs first
            await conn.execute(q["inspect_custom_plans"])
            await conn.execute(f"PREPARE page({TYPES}) AS {q['find_deliveries']}")
            rows = await conn.fetch("EXPLAIN EXECUTE page(" + ", ".join(["NULL"] * 15) + ", 51)")
    finally:
        await conn.close()
    plan = "\n".join(r[0] for r in rows)
    # The log's chunk holding the events (the empty chunk ahead and events_kept read nothing).
    assert "deliveries_pkey" in plan and "Seq Scan on events_0 " not in plan, plan


@pytest.mark.parametrize("query", ["find_deliveries_dead", "count_deliveries_dead"])
async def test_sqlite_dead_letter_reads_use_the_dead_letter_index(tmp_path, query: str) -> None:
    from eventbus import Bus
    from eventbus.backends._sql import load_queries
    from eventbus.backends.sqlite.inspect import filter_params

    bus = Bus(f"sqlite:///{tmp_path / 'bus.db'}")
    try:
        await bus.migrate()
    finally:
        await bus.aclose()
    sql = load_queries("sqlite", "main")[query]
    params = {**filter_params(DEAD), "limit": 51, "cap": 10_001}
    with sqlite3.connect(tmp_path / "bus.db") as conn:
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert any("USING INDEX deliveries_dead" in step for step in plan), plan
    assert not any("PRIMARY KEY" in step for step in plan if step.startswith(("SCAN d", "SEARCH d"))), plan


OLD_DEAD = """
WITH ev AS (
    INSERT INTO {s}.events (event_type, payload)
    SELECT 'order.placed', convert_to('{{"order_id":"' || g || '"}}', 'UTF8')
    FROM generate_series(1, $1::int) g
    RETURNING id
)
INSERT INTO {s}.deliveries (event_id, subscription_id, run_at, status, last_error)
SELECT id, $2::int, now() - interval '1 hour',
       CASE WHEN id <= $3 THEN 'dead' ELSE 'completed' END,
       CASE WHEN id <= $3 THEN 'KeyError: order ' || id || ' not found' END
FROM ev
"""


@pytest.mark.parametrize(("limit", "most"), [(51, 60), (501, 510)])
async def test_newest_dead_letters_are_read_alone_however_old(pg_target, limit: int, most: int) -> None:
    """The /dead page (51 rows) and the triage page's sample (501 here) when the dead letters are old.

    5,000 dead letters under 25,000 newer completed deliveries: newest first,
    the read takes the dead rows from deliveries_dead_newest, as many as it
    keeps, instead of walking the primary key back through every completed
    delivery (or sorting all the dead ones), planned for its values as the
    dashboard runs it and generically.
    """
    from eventbus.backends.postgres.inspect import filter_args

    q, conn, s = await migrated(pg_target)
    try:
        sub_id = await subscription(conn, s)
        await conn.execute(OLD_DEAD.format(s=s), 30_000, sub_id, 5_000)
        await conn.execute(f"VACUUM ANALYZE {s}.deliveries, {s}.events, {s}.subscriptions")
        async with conn.transaction():
            await conn.execute(q["inspect_custom_plans"])
            plan = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + q["find_deliveries_dead"], *filter_args(DEAD), None, limit
            )
        generic = await _generic_plan(
            conn, q["find_deliveries_dead"], _args().replace(", 0, 1000", f", NULL, {limit}")
        )
    finally:
        await conn.close()
    found = json.loads(plan)[0]
    assert "deliveries_dead_newest" in json.dumps(found), found
    assert rows_read(found, "deliveries") <= most, found
    assert "deliveries_dead_newest" in generic and "Sort" not in generic, generic


@pytest.mark.parametrize("query", ["find_deliveries_dead", "count_deliveries_dead"])
async def test_sqlite_dead_letters_are_read_newest_first_without_a_sort(tmp_path, query: str) -> None:
    from eventbus import Bus
    from eventbus.backends._sql import load_queries
    from eventbus.backends.sqlite.inspect import filter_params

    bus = Bus(f"sqlite:///{tmp_path / 'bus.db'}")
    try:
        await bus.migrate()
    finally:
        await bus.aclose()
    sql = load_queries("sqlite", "main")[query]
    params = {**filter_params(DEAD), "limit": 51, "cap": 10_001}
    with sqlite3.connect(tmp_path / "bus.db") as conn:
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert any("USING INDEX deliveries_dead_newest" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan
