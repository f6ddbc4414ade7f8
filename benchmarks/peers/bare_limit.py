"""The "limit": a bare asyncpg claim/complete loop on a minimal jobs table.

    python -m benchmarks.peers.bare_limit \
        --dsn postgresql://postgres@127.0.0.1:5432/bench_bare --n 50000 --json bare.json

Each loop iteration is two autocommit statements: claim up to 100 pending rows
with FOR UPDATE SKIP LOCKED, then mark them done with one UPDATE ... FROM unnest.
Reported for 1 connection and for 2 concurrent connections (one process).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import asyncpg

from benchmarks.peers.common import env_note, now, payload, record, recreate_database, write_results

CLAIM = 100

SCHEMA = """
CREATE TABLE jobs (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status  text   NOT NULL DEFAULT 'pending',
    payload bytea  NOT NULL
);
CREATE INDEX jobs_pending ON jobs (id) WHERE status = 'pending';
"""

CLAIM_SQL = """
UPDATE jobs SET status = 'running'
WHERE id IN (
    SELECT id FROM jobs WHERE status = 'pending'
    ORDER BY id FOR UPDATE SKIP LOCKED LIMIT $1
)
RETURNING id, payload
"""

DONE_SQL = """
UPDATE jobs SET status = 'done'
FROM unnest($1::bigint[]) AS d(id)
WHERE jobs.id = d.id
"""


async def setup(dsn: str, n: int) -> None:
    """Fresh database holding n pending rows (loaded with COPY, not timed)."""
    await recreate_database(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
        body = json.dumps(payload(0)).encode()
        await conn.copy_records_to_table("jobs", records=[(body,)] * n, columns=["payload"])
        await conn.execute("VACUUM ANALYZE jobs")
    finally:
        await conn.close()


async def worker(dsn: str) -> int:
    """Claim + complete until the table has no pending row; return rows handled."""
    conn = await asyncpg.connect(dsn)
    handled = 0
    try:
        while True:
            rows = await conn.fetch(CLAIM_SQL, CLAIM)
            if not rows:
                return handled
            await conn.execute(DONE_SQL, [r["id"] for r in rows])
            handled += len(rows)
    finally:
        await conn.close()


async def one_run(dsn: str, n: int, connections: int, timeout: float) -> float:
    await setup(dsn, n)
    t0 = now()
    counts = await asyncio.wait_for(asyncio.gather(*(worker(dsn) for _ in range(connections))), timeout)
    rate = sum(counts) / (now() - t0)
    assert sum(counts) == n, counts
    print(f"  bare connections={connections}: {rate:,.0f} rows/s split={counts}", flush=True)
    return rate


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/bench_bare")
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    print(f"bare asyncpg {asyncpg.__version__} {env_note()}", flush=True)
    recs = []
    for conns in (1, 2):
        runs = [await one_run(args.dsn, args.n, conns, args.timeout) for _ in range(args.runs)]
        setting = f"claim {CLAIM} SKIP LOCKED + done via unnest, {conns} connection(s)"
        recs.append(
            record(
                "bare_asyncpg",
                "bare_skip_locked",
                setting,
                runs,
                n=args.n,
                unit="rows/s",
                workers=conns,
            )
        )
    write_results(args.json, recs)


if __name__ == "__main__":
    asyncio.run(main())
