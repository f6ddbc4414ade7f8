"""The dashboard's machine pages count each (state, status) up to the cap (PostgreSQL).

/machines and /machines/NAME count the instances of a machine per group as
the dashboard runs it (planned for its values): the groups are found by
skipping through wf_instances_status and each is counted up to cap + 1 rows,
so the read stays bounded however many instances the machine has.
"""

from __future__ import annotations

import json

import pytest

from ..support.plans import migrated, rows_read

SEED = """
INSERT INTO {s}.wf_instances (machine, key, state, status, checkpoint)
SELECT 'bench', 'k-' || g,
       CASE g % 3 WHEN 0 THEN 'CHARGE' WHEN 1 THEN 'SHIP' ELSE 'DONE' END,
       CASE WHEN g % 3 = 2 THEN 'completed' WHEN g % 10 = 0 THEN 'waiting_approval' ELSE 'waiting' END,
       '{{}}'::bytea
FROM generate_series(1, $1::int) g
UNION ALL
SELECT m, 'k-1', 'SHIP', 'waiting', '{{}}'::bytea FROM unnest(ARRAY['alpha', 'zulu']) m
"""


@pytest.fixture
async def seeded(pg_target):
    """Queries and a connection to 20,000 instances of 'bench' in five groups, and one each of two others."""
    q, conn, s = await migrated(pg_target)
    await conn.execute(SEED.format(s=s), 20_000)
    await conn.execute(f"VACUUM ANALYZE {s}.wf_instances")
    try:
        yield q, conn
    finally:
        await conn.close()


async def test_machine_counts_read_at_most_cap_plus_one_rows_a_group(seeded) -> None:
    q, conn = seeded
    async with conn.transaction(readonly=True):
        plan = json.loads(
            await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + q["wf_counts_capped"], "bench", 101)
        )[0]
        found = await conn.fetch(q["wf_counts_capped"], "bench", 101)
        exact = await conn.fetch(q["wf_counts"], "bench")
    groups = {(r["state"], r["status"]): r["n"] for r in exact}
    assert len(groups) == 5 and sum(groups.values()) == 20_000
    assert {(r["state"], r["status"]): r["n"] for r in found} == {g: min(n, 101) for g, n in groups.items()}
    assert "wf_instances_status" in json.dumps(plan), plan
    # five groups of at most 101 rows, plus one probe per group (and one past the last)
    assert rows_read(plan, "wf_instances") <= 5 * 101 + 6, plan
