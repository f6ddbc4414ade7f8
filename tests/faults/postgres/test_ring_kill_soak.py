"""Kill soak on the append-only hot path: SIGKILL random workers while the ring rotates and empties.

The workload and the kills of test_kill_soak.py (3,600 deliveries, 3 worker
processes with a 2 s lease, one SIGKILL every 0.5-1 s, restarted at once), on a
bus with ``append_only=True``: ordinary deliveries live in the ring, and the
workers' upkeep rotates its slots (every 2 s while publishes come), moves the
claims left open by a killed worker into ``deliveries`` and TRUNCATEs the
slots meanwhile. Afterwards, through ``delivery_rows`` (every delivery wherever
it lives): lost 0, nothing stuck, each delivery shown once (never both in the
ring's outcome log and in ``deliveries``), completed or dead with its error,
one follow-up per order key, and every completed delivery's handler ran.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from ...conftest import Target
from ._support import Procs, prepare, worker_id_of
from .test_kill_soak import AUDITS, ORDERS, WORKER_ARGS, WORKER_ENV, WORKERS, _publish_workload, check_ended


@pytest.fixture
async def ring_target(pg_target: Target) -> AsyncIterator[Target]:
    target = Target("postgres", pg_target.dsn, pg_target.schema, options={"append_only": True})
    await prepare(target)
    yield target


async def _unfinished(db: asyncpg.Connection, s: str) -> tuple[int, int]:
    row = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE status IN ('pending', 'processing')), "
        f"count(*) FILTER (WHERE status NOT IN ('pending', 'processing')) FROM \"{s}\".delivery_rows"
    )
    assert row is not None
    return int(row[0]), int(row[1])


async def _drained(db: asyncpg.Connection, s: str, stall: float = 15.0) -> None:
    ended, since = -1, time.monotonic()
    while True:
        open_, done = await _unfinished(db, s)
        if open_ == 0 and done == ORDERS * 2 + AUDITS:
            return
        if done != ended:
            ended, since = done, time.monotonic()
        assert time.monotonic() - since < stall, f"stalled: {open_} unfinished, {done} ended"
        await asyncio.sleep(0.2)


async def test_kill_soak_on_the_ring(ring_target: Target, tmp_path: Path) -> None:
    s = ring_target.schema or ""
    db = await asyncpg.connect(ring_target.dsn)
    procs = Procs(ring_target, tmp_path)
    try:
        workers = [procs.worker(*WORKER_ARGS, env=WORKER_ENV, name=f"w{i}") for i in range(WORKERS)]
        for w in workers:
            await worker_id_of(db, s, w.pid)
        await _publish_workload(ring_target)
        rng, kills = random.Random(20261205), 0
        while kills < 8:
            await asyncio.sleep(rng.uniform(0.5, 1.0))
            if (await _unfinished(db, s))[0] == 0:
                break
            i = rng.randrange(len(workers))
            workers[i].signal(signal.SIGKILL)
            await workers[i].wait_async(5)
            kills += 1
            workers[i] = procs.worker(*WORKER_ARGS, env=WORKER_ENV, name=f"w{i}")
        assert kills >= 6, f"the workload ended after only {kills} kills"
        await _drained(db, s)

        # The kill soak's checks, over every delivery wherever it lives.
        statuses = await check_ended(db, s, "delivery_rows")
        # Each delivery shown once: never both in the ring's outcome log and in deliveries.
        twice = await db.fetchval(
            f'SELECT count(*) FROM (SELECT id FROM "{s}".delivery_rows GROUP BY id HAVING count(*) > 1) t'
        )
        assert twice == 0
        # The ring was in use and emptied slots under the kills; some claims left it.
        in_log = await db.fetchval(f"SELECT count(*) FROM \"{s}\".delivery_log WHERE status = 'completed'")
        rotations = await db.fetchval(f"SELECT count(*) FROM \"{s}\".ring_log WHERE kind = 'open'")
        assert in_log > ORDERS and rotations >= 2, (in_log, rotations)
        print(
            f"\nring kill soak: {kills} kills, {statuses}, {in_log} completed in the ring, {rotations} gens"
        )
    finally:
        await procs.aclose()
        await db.close()
