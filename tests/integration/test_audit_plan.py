"""The audit page's filters read their own index newest first, whatever they match (both backends).

20,000 audit rows where no operator ever does one of the actions (bob never
cancels: counted independently, about a twenty-fourth of the rows would
match), and one operator whose five rows are the oldest of all. Each filter
(action, actor, both), from the top and below a ``before=`` cursor, is a
backward range read of its index: it reads the rows it returns, not the whole
table, both when PostgreSQL plans for the values given and when it reuses one
plan for any value (as a prepared statement does after a few runs).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from eventbus.backends._sql import load_queries
from eventbus.backends.sqlite import SQLiteBackend

from ..support.plans import migrated, rows_read

ROWS = 20_000
TOP = 2**62

PG_SEED = """
INSERT INTO {s}.audit_log (at, actor, origin, action, target, filter, count, interface)
SELECT now() - g * interval '1 second',
       CASE WHEN g > $1::int - 5 THEN 'erin' ELSE (ARRAY['alice', 'bob', 'carol', 'dave'])[1 + g % 4] END,
       '127.0.0.1', (ARRAY['replay', 'purge', 'cancel', 'pause', 'resume', 'approve'])[1 + g % 6],
       'billing', NULL, 1, 'dashboard'
FROM generate_series($1::int, 1, -1) g
"""

SQLITE_SEED = """
WITH RECURSIVE g(n) AS (SELECT :rows UNION ALL SELECT n - 1 FROM g WHERE n > 1)
INSERT INTO audit_log (at, actor, origin, action, target, filter, count, interface)
SELECT 1e9 - n,
       CASE WHEN n > :rows - 5 THEN 'erin' ELSE 'op-' || (n % 4) END,
       '127.0.0.1', 'act-' || (n % 6), 'billing', NULL, 1, 'dashboard'
FROM g
"""

# (query, its index, its parameter types after the cursor and limit, the filter's values, rows it finds)
CASES = [
    ("audit_page_action", "audit_log_action", ["text"], ["nothing"], 0),
    ("audit_page_action", "audit_log_action", ["text"], ["cancel"], 51),
    ("audit_page_actor", "audit_log_actor", ["text"], ["nobody"], 0),
    ("audit_page_actor", "audit_log_actor", ["text"], ["erin"], 5),
    ("audit_page_actor_action", "audit_log_actor_action", ["text", "text"], ["cancel", "bob"], 0),
    ("audit_page_actor_action", "audit_log_actor_action", ["text", "text"], ["cancel", "erin"], 1),
]


@pytest.fixture
async def seeded(pg_target):
    """The audit queries and a connection to the 20,000 rows, analysed."""
    q, conn, s = await migrated(pg_target)
    await conn.execute(PG_SEED.format(s=s), ROWS)
    await conn.execute(f"VACUUM ANALYZE {s}.audit_log")
    try:
        yield q, conn
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("before", [None, ROWS // 2])
async def test_each_filter_reads_its_index_on_postgres(seeded, mode: str, before: int | None) -> None:
    q, conn = seeded
    found = {}
    async with conn.transaction():
        await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
        for n, (name, index, types, values, _) in enumerate(CASES):
            await conn.execute(f"PREPARE audit_{n} (bigint, bigint, {', '.join(types)}) AS {q[name]}")
            args = ", ".join([str(before or TOP), "51", *(f"'{v}'" for v in values)])
            plan = json.loads(
                await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE audit_{n} ({args})")
            )[0]
            found[n] = plan["Plan"]["Actual Rows"]
            assert index in json.dumps(plan), plan
            assert rows_read(plan, "audit_log") <= 51, plan
        await conn.execute("DEALLOCATE ALL")
    # below the cursor, the oldest rows (erin's) are all still there; the common action fills a page
    assert found == {n: case[4] for n, case in enumerate(CASES)}


async def test_each_filter_reads_its_index_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "bus.db"
    backend = SQLiteBackend(f"sqlite:///{path}", migrate=True)
    await backend.schema.migrate()
    await backend.aclose()
    q = load_queries("sqlite", "main")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(SQLITE_SEED, {"rows": ROWS})
        conn.execute("ANALYZE")
        params = {"before": ROWS // 2, "limit": 51, "action": "act-2", "actor": "op-1"}
        for name in ("audit_page_action", "audit_page_actor", "audit_page_actor_action"):
            index = name.replace("audit_page", "audit_log")
            plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {q[name]}", params)]
            assert len(plan) == 1 and plan[0].startswith(f"SEARCH audit_log USING INDEX {index} ("), plan
        # op-1 (odd rows) never does act-2 (even rows): nothing, read from the index alone
        assert conn.execute(q["audit_page_actor_action"], params).fetchall() == []
        erin = conn.execute(q["audit_page_actor"], {**params, "actor": "erin"}).fetchall()
        assert [r[0] for r in erin] == [5, 4, 3, 2, 1]
    finally:
        conn.close()
