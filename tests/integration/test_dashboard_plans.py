"""The dashboard's delivery lists by status read that status's rows alone (PostgreSQL).

/deliveries?status=processing and ?status=cancelled, listed and counted as the
dashboard runs them (planned for their values): the rows come from the lease
index and the cancelled partial index, not from a walk of the whole history,
however old they are. Dead letters: see ``test_dead_letter_plan``.
"""

from __future__ import annotations

import json
import re

import asyncpg
import pytest

from eventbus.backends.postgres.inspect import filter_args
from eventbus.types import DeliveryFilter, DeliveryStatus

from ..support.plans import migrated, rows_read, subscription

SEED = """
WITH ev AS (
    INSERT INTO {s}.events (event_type, key, payload)
    SELECT 'order.placed', 'k-' || g, convert_to('{{"order_id":"' || g || '"}}', 'UTF8')
    FROM generate_series(1, $1::int) g
    RETURNING id
)
INSERT INTO {s}.deliveries (event_id, subscription_id, status, lease_until, lease_token)
SELECT id, $2::int,
       CASE WHEN id <= 300 THEN 'processing' WHEN id <= 600 THEN 'cancelled' WHEN id <= 900 THEN 'dead'
            ELSE 'completed' END,
       CASE WHEN id <= 300 THEN now() + interval '30 seconds' END,
       CASE WHEN id <= 300 THEN gen_random_uuid() END
FROM ev
"""


@pytest.fixture
async def seeded(pg_target):
    """Queries and a connection to 30,000 deliveries: the oldest 300 processing, 300 cancelled, 300 dead."""
    q, conn, s = await migrated(pg_target)
    sub_id = await subscription(conn, s)
    await conn.execute(SEED.format(s=s), 30_000, sub_id)
    await conn.execute(f"VACUUM ANALYZE {s}.deliveries, {s}.events, {s}.subscriptions")
    try:
        yield q, conn
    finally:
        await conn.close()


async def _plan(conn: asyncpg.Connection, q: dict[str, str], name: str, flt: DeliveryFilter, *tail) -> dict:
    async with conn.transaction(readonly=True):
        await conn.execute(q["inspect_timeout"])  # what every dashboard read runs first
        await conn.execute(q["inspect_custom_plans"])
        found = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q[name], *filter_args(flt), *tail
        )
    return json.loads(found)[0]


@pytest.mark.parametrize(("status", "index"), [("processing", "deliveries_lease_until"),
                                               ("cancelled", "deliveries_cancelled")])  # fmt: skip
async def test_a_status_list_and_its_count_read_that_status_alone(
    seeded, status: DeliveryStatus, index: str
) -> None:
    q, conn = seeded
    flt = DeliveryFilter(status=status)
    page = await _plan(conn, q, "find_deliveries", flt, None, 51)
    count = await _plan(conn, q, "count_deliveries", flt, 10_001)
    for plan in (page, count):
        assert index in json.dumps(plan), plan
        assert rows_read(plan, "deliveries") <= 300, plan


async def test_the_overview_counts_a_bounded_window(seeded) -> None:
    """The overview's completed counts and events read the newest N rows, not the 30,000 there are."""
    q, conn = seeded
    async with conn.transaction(readonly=True):
        recent = json.loads(
            await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + q["status_recent"], 5_000)
        )[0]
        events = json.loads(
            await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + q["status_events_capped"], 5_000)
        )[0]
    assert rows_read(recent, "deliveries") == 5_000, recent
    assert rows_read(events, "events") == 5_000, events


async def test_a_key_is_looked_up_by_its_event_type_not_scanned_for(seeded) -> None:
    """/deliveries?key=…: one probe of events_type_key per subscription, not a read of the 30,000 events
    (or of the whole index, the key being its second column)."""
    q, conn = seeded
    flt = DeliveryFilter(key="k-20000")
    page = await _plan(conn, q, "find_deliveries", flt, None, 51)
    count = await _plan(conn, q, "count_deliveries", flt, 10_001)
    for plan in (page, count):
        # The index, or on PostgreSQL its copy on the event log's chunk.
        assert re.search(r"events_type_key|events_\d+_event_type_key_idx", json.dumps(plan)), plan
        top = plan["Plan"]
        assert top["Actual Rows"] == 1, plan
        assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] <= 30, plan


async def test_dead_letters_of_a_type_are_counted_from_the_dead_letters(seeded) -> None:
    """/dead?event_type=…: the type is the subscription's, so the count walks the 300 dead letters
    and looks up their events, instead of reading every event of the type first."""
    q, conn = seeded
    flt = DeliveryFilter(status="dead", event_type="order.placed")
    count = await _plan(conn, q, "count_deliveries_dead", flt, 10_001)
    assert rows_read(count, "deliveries") == 300, count
    assert rows_read(count, "events") <= 300, count
