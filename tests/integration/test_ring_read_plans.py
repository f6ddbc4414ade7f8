"""The operator's reads on the append-only path read each store on its own (PostgreSQL).

A delivery there lives in deliveries, in the ring or in the outcome log
(delivery_log); delivery_rows shows the three as one, but the planner reads
the log's branch of that view whole. The lists, counts, id walks and status
reads of a bus with ``append_only=True`` (see take_append_only in _db.py) read
the log by its days' primary keys instead, and answer what the view answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import pytest

from eventbus.backends.postgres.inspect import filter_args
from eventbus.types import DeliveryFilter

from ..conftest import Target
from ..support.plans import rows_read, subscription

COMPLETED = 20_000

SEED = """
WITH ev AS (
    INSERT INTO {s}.events (event_type, key, payload, created_at)
    SELECT 'order.placed', 'k-' || g, convert_to('{{"order_id":"' || g || '"}}', 'UTF8'),
           now() - ($1::int - g) * interval '1 second'
    FROM generate_series(1, $1::int) g
    RETURNING id, created_at
)
INSERT INTO {s}.delivery_log (claimed_on, delivery_id, subscription_id, event_id, status, enqueued_at,
                              claimed_at, finished_at)
SELECT (now() AT TIME ZONE 'UTC')::date, nextval(pg_get_serial_sequence('{s}.deliveries', 'id')), $2::int,
       id, CASE WHEN id % 100 = 0 THEN 'moved' ELSE 'completed' END, created_at, created_at, created_at
FROM ev ORDER BY id
"""

# Off the ring: the moved ones, now dead letters; ready rows nothing claimed; one claim.
REST = """
INSERT INTO {s}.deliveries (id, event_id, subscription_id, status, attempts, last_error)
OVERRIDING SYSTEM VALUE
SELECT delivery_id, event_id, subscription_id, 'dead', 3, 'KeyError: ' || event_id
FROM {s}.delivery_log WHERE status = 'moved';
WITH ev AS (
    INSERT INTO {s}.events (event_type, key, payload)
    SELECT 'order.placed', 'r-' || g, convert_to('{{}}', 'UTF8') FROM generate_series(1, 50) g
    RETURNING id
)
INSERT INTO {s}.ring_ready (slot, delivery_id, subscription_id, event_id)
SELECT 0, nextval(pg_get_serial_sequence('{s}.deliveries', 'id')), {sub}, id FROM ev ORDER BY id;
INSERT INTO {s}.ring_claims (slot, delivery_id, subscription_id, event_id, lease_token, worker_id,
                             lease_until, enqueued_at)
SELECT slot, delivery_id, subscription_id, event_id, gen_random_uuid(), gen_random_uuid(),
       now() + interval '30 seconds', enqueued_at
FROM {s}.ring_ready ORDER BY delivery_id LIMIT 5;
"""


@pytest.fixture
async def ring_reads(pg_target: Target) -> Any:
    """The append-only bus's queries, the view's versions of them, and a connection to the seed."""
    bus = pg_target.bus(append_only=True)
    try:
        await bus.migrate()
        q = dict(bus.backend.db.q)  # type: ignore[attr-defined]
    finally:
        await bus.aclose()
    s = f'"{pg_target.schema}"'
    plain = pg_target.bus()
    try:
        table = re.compile(re.escape(s) + r"\.deliveries\b")
        viewed = {name: table.sub(f"{s}.delivery_rows", sql) for name, sql in plain.backend.db.q.items()}  # type: ignore[attr-defined]
    finally:
        await plain.aclose()
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        sub = await subscription(conn, s)
        await conn.execute(SEED.format(s=s), COMPLETED, sub)
        await conn.execute(REST.format(s=s, sub=sub))
        tables = ("deliveries", "events", "delivery_log", "ring_ready", "subscriptions")
        await conn.execute("VACUUM ANALYZE " + ", ".join(f"{s}.{t}" for t in tables))
        yield q, viewed, conn
    finally:
        await conn.close()


async def _run(conn: asyncpg.Connection, sql: str, *args: Any, explain: bool = False) -> Any:
    async with conn.transaction(readonly=True):
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")  # as the bus's sessions
        if explain:
            return json.loads(await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args))[0]
        return [tuple(r) for r in await conn.fetch(sql, *args)]


FILTERS = [
    (DeliveryFilter(), None),
    (DeliveryFilter(), 15_000),
    (DeliveryFilter(status="completed"), None),
    (DeliveryFilter(status="pending"), None),
    (DeliveryFilter(status="processing"), None),
    (DeliveryFilter(status="dead"), None),
    (DeliveryFilter(subscription="h", status="completed"), 12_345),
    (DeliveryFilter(event_type="order.placed"), None),
]


async def test_a_list_reads_a_page_of_the_log_and_answers_as_the_view(ring_reads) -> None:
    q, viewed, conn = ring_reads
    for flt, before in FILTERS:  # one seed for every filter: seeding is most of the time
        name = "find_deliveries_dead" if flt.status == "dead" else "find_deliveries"
        args = (*filter_args(flt), before, 51)
        assert await _run(conn, q[name], *args) == await _run(conn, viewed[name], *args), (flt, before)
        plan = await _run(conn, q[name], *args, explain=True)
        assert rows_read(plan, "delivery_log") <= 51 * 2, (flt, plan)  # a page (moved outcomes skipped)


async def test_counts_and_id_walks_answer_as_the_view(ring_reads) -> None:
    q, viewed, conn = ring_reads
    for flt, before in FILTERS:
        for name, tail in (("count_deliveries", (101,)), ("count_deliveries", (100_000,)),
                           ("delivery_ids", (before or 0, 200))):  # fmt: skip
            args = (*filter_args(flt), *tail)
            assert await _run(conn, q[name], *args) == await _run(conn, viewed[name], *args), (name, flt)


async def test_a_capped_count_stops_at_its_cap(ring_reads) -> None:
    q, _, conn = ring_reads
    plan = await _run(conn, q["count_deliveries"], *filter_args(DeliveryFilter()), 101, explain=True)
    assert rows_read(plan, "delivery_log") <= 101 * 2, plan  # the cap (the moved outcomes skipped)


async def test_status_adds_up_each_store(ring_reads) -> None:
    q, viewed, conn = ring_reads
    found = await _run(conn, q["status"])
    assert found == await _run(conn, viewed["status"])
    assert {r[2]: r[3] for r in found} == {"completed": 19_800, "dead": 200, "pending": 45, "processing": 5}


async def test_the_windowed_status_reads_the_window_alone(ring_reads) -> None:
    q, viewed, conn = ring_reads
    for name in ("status_recent", "health_completed_recent"):
        assert sorted(await _run(conn, q[name], 500)) == sorted(await _run(conn, viewed[name], 500)), name
        plan = await _run(conn, q[name], 500, explain=True)
        assert rows_read(plan, "delivery_log") <= 500 + 10, plan
