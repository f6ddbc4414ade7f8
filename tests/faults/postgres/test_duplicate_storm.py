"""Duplicate storm: concurrent publishers over few keys, some in transactions
that roll back -> one row per committed key, no leaked unique violations, no
deadlocks, and every acknowledged publish names the row that exists."""

from __future__ import annotations

import asyncio
import random

import asyncpg

from eventbus import Envelope
from eventbus.backends.base import SubscriptionSpec

from ...apps.fault_events import Audit

TASKS = 20
KEYS = 300
OPS_PER_TASK = 60


class Rollback(Exception):
    pass


async def test_duplicate_storm(fault_target, db) -> None:
    s = fault_target.schema
    bus = fault_target.bus()
    committed: dict[str, set[int]] = {}  # key -> event ids returned by committed publishes
    rolled_back: set[str] = set()
    errors: list[BaseException] = []
    pool = await asyncpg.create_pool(fault_target.dsn, min_size=TASKS, max_size=TASKS)
    try:
        async with bus:
            await bus.backend.deliveries.register(
                [
                    SubscriptionSpec("audit", "fault.audit", 5, 30.0),
                    SubscriptionSpec("audit2", "fault.audit", 5, 30.0),
                ]
            )

            def ack(keys: list[str], results) -> None:
                for key, r in zip(keys, results, strict=True):
                    committed.setdefault(key, set()).add(r.event_id)

            async def publisher(seed: int) -> None:
                rng = random.Random(seed)
                for _ in range(OPS_PER_TASK):
                    keys = rng.sample(range(KEYS), rng.choice([1, 1, 1, 3, 5]))
                    names = [f"k{k}" for k in keys]
                    batch = [Envelope(Audit(n=k), key=f"k{k}") for k in keys]
                    mode = rng.choice(["plain", "commit", "rollback"])
                    if any(k % 10 == 0 for k in keys):  # these keys never commit
                        mode = "rollback"
                    try:
                        if mode == "plain":
                            ack(names, await bus.publish_many(batch))
                            continue
                        async with pool.acquire() as conn:
                            try:
                                async with conn.transaction():
                                    results = await bus.publish_many(batch, connection=conn)
                                    if mode == "rollback":
                                        raise Rollback
                            except Rollback:
                                rolled_back.update(names)
                                continue
                        ack(names, results)
                    except Exception as exc:  # every error is a finding
                        errors.append(exc)

            await asyncio.wait_for(asyncio.gather(*(publisher(i) for i in range(TASKS))), timeout=60)
    finally:
        await pool.close()

    assert not errors, [f"{type(e).__name__}: {e}" for e in errors[:5]]
    rows = await db.fetch(f"SELECT key, id FROM \"{s}\".events WHERE event_type = 'fault.audit'")
    in_db: dict[str, list[int]] = {}
    for r in rows:
        in_db.setdefault(r["key"], []).append(r["id"])
    assert all(len(ids) == 1 for ids in in_db.values())
    assert not any(int(k[1:]) % 10 == 0 for k in in_db), "a rolled-back publish is visible"
    assert set(in_db) == set(committed), (
        f"missing {sorted(set(committed) - set(in_db))[:5]}, "
        f"uncommitted present {sorted(set(in_db) - set(committed))[:5]}"
    )
    for key, ids in committed.items():  # every acknowledgement names the row that exists
        assert ids == {in_db[key][0]}, (key, ids, in_db[key])
    # One delivery per event and subscription, none orphaned by a rollback.
    assert await db.fetchval(f'SELECT count(*) FROM "{s}".deliveries') == 2 * len(in_db)
    assert (
        await db.fetchval(
            f'SELECT count(*) FROM "{s}".deliveries d WHERE NOT EXISTS '
            f'(SELECT 1 FROM "{s}".events e WHERE e.id = d.event_id)'
        )
        == 0
    )
    print(
        f"\nduplicate storm: {TASKS} publishers x {OPS_PER_TASK} ops over {KEYS} keys: "
        f"{len(in_db)} keys committed, {len(rolled_back - set(in_db))} only rolled back"
    )
