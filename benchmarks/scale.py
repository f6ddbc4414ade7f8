"""Scale figures on PostgreSQL: big backlogs, a big log, and a held-back xmin horizon.

    python -m benchmarks.scale --dsn postgresql://postgres@127.0.0.1:5432/bench_scale \
        --sizes 10000,100000,1000000 --log-size 1000000 --xmin-seconds 120 --json scale.json

Parts (``--only backlog,publish,xmin``):

* ``backlog``: for each size, that many pending deliveries (loaded with SQL,
  then ``VACUUM ANALYZE`` as autovacuum would), the claim's plan with
  ``EXPLAIN (ANALYZE, BUFFERS)``, the latency of 30 claims of 100 (put back
  afterwards), and the rate
  at which one worker (concurrency 200, batch 100, no-op handler) drains the
  first ``--drain-n`` of them.
* ``publish``: single publishes (one awaited call at a time) and batch
  publishes (1,000 per call) into empty tables and into tables already holding
  ``--log-size`` events (their deliveries completed), side by side.
* ``xmin``: a producer (batches of 200, at most 20,000 ahead of the worker)
  and one worker for ``--xmin-seconds``, once clean and once while another
  connection holds ``BEGIN; SELECT txid_current();`` open: completed
  deliveries/s, dead tuples at the end and WAL bytes per completed delivery.

Every case starts on a freshly recreated database (the name must start with
``bench_``). With ``--append-only`` the bus is ``Bus(dsn, append_only=True)``:
the loaded backlog is older than the ring (it never entered it), so it is
served from ``deliveries`` by the ring path's claim there
(``ring_claim_queue``), whose plan is the one shown; the latency probe and the
drain go through the store's claim as a worker's do.

    python -m benchmarks.scale --dsn postgresql://postgres@127.0.0.1:5432/bench_scale \
        --only backlog --append-only --sizes 100000,1000000,10000000 --json scale_append_only.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.peers.common import PAYLOAD_PAD, recreate_database
from eventbus import Bus, Context, Envelope, Event, Worker

SCHEMA = "eventbus"


class ScaleTick(Event, event_type="bench.scale_tick"):
    i: int
    pad: str = PAYLOAD_PAD


PRELOAD = f"""
WITH ev AS (
    INSERT INTO {SCHEMA}.events (event_type, payload)
    SELECT 'bench.scale_tick', convert_to('{{"i":' || g || ',"pad":"{PAYLOAD_PAD}"}}', 'UTF8')
    FROM generate_series(1, $1::int) g
    RETURNING id, deliver_at
)
INSERT INTO {SCHEMA}.deliveries (event_id, subscription_id, run_at, status)
SELECT id, $2::int, deliver_at, $3::text FROM ev
"""


async def fresh_bus(dsn: str, on_event: Any = None, append_only: bool = False) -> tuple[Bus, int]:
    await recreate_database(dsn)
    bus = Bus(dsn, schema=SCHEMA, append_only=append_only)

    @bus.subscribe(ScaleTick, name="scale")
    async def handle(event: ScaleTick, ctx: Context) -> None:
        if on_event is not None:
            on_event()

    await bus.migrate()
    ids = await bus.register()
    return bus, ids["scale"]


async def preload(dsn: str, sub_id: int, size: int, status: str) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        for start in range(0, size, 250_000):
            await conn.execute(PRELOAD, min(250_000, size - start), sub_id, status)
        await conn.execute("VACUUM ANALYZE")
        # Write the load out now: otherwise the checkpoint it triggers runs
        # during the measurement, and a 10M load's writes slow every commit.
        await conn.execute("CHECKPOINT")
        return time.perf_counter() - t0
    finally:
        await conn.close()


async def claim_plan(bus: Bus, dsn: str, sub_id: int) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        db: Any = bus.backend.db  # type: ignore[attr-defined]
        args = (sub_id, 100, 30.0, uuid.uuid4(), uuid.uuid4(), 9 * db.priority_step)  # the claim's reach
        ring: Any = getattr(bus.backend.deliveries, "ring", None)
        if ring is None:
            rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + db.q["claim"], *args)
        else:  # the claim from deliveries beside the ring, from the ring's start
            window = await ring.claimable(conn)
            rows = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) " + db.q["ring_claim_queue"], *args, window, 0
            )
        await tx.rollback()
        return "\n".join(r[0] for r in rows)
    finally:
        await conn.close()


async def unclaim(dsn: str) -> None:
    """Put the rows the latency probe claimed back, so the drain finds the whole backlog."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"UPDATE {SCHEMA}.deliveries SET status = 'pending', attempts = 0, lease_until = NULL,"
            " lease_token = NULL, worker_id = NULL WHERE status = 'processing'"
        )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def backlog_case(dsn: str, size: int, drain_n: int, append_only: bool = False) -> dict[str, Any]:
    done = Counter(drain_n)
    bus, sub_id = await fresh_bus(dsn, done.hit, append_only)
    try:
        load_s = await preload(dsn, sub_id, size, "pending")
        plan = await claim_plan(bus, dsn, sub_id)
        latencies = []
        for _ in range(30):
            t0 = time.perf_counter()
            await bus.backend.deliveries.claim(sub_id, 100, 30.0, str(uuid.uuid4()))
            latencies.append((time.perf_counter() - t0) * 1000)
        await unclaim(dsn)
        worker = Worker(bus, concurrency=200, batch_size=100, poll_interval_seconds=30)
        t0 = time.perf_counter()
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.event.wait(), 600)
        rate = drain_n / (time.perf_counter() - t0)
        worker.stop()
        await asyncio.wait_for(task, 60)
    finally:
        await bus.aclose()
    out = {
        "part": "backlog",
        "append_only": append_only,
        "pending": size,
        "load_seconds": round(load_s, 1),
        "claim_ms_p50": round(statistics.median(latencies), 3),
        "claim_ms_p95": round(sorted(latencies)[28], 3),
        "claim_ms_max": round(max(latencies), 3),
        "drain_n": drain_n,
        "drain_per_second": round(rate),
        "claim_plan": plan,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "claim_plan"}), flush=True)
    print(plan, flush=True)
    return out


class Counter:
    def __init__(self, target: int) -> None:
        self.target, self.count, self.event = target, 0, asyncio.Event()

    def hit(self) -> None:
        self.count += 1
        if self.count >= self.target:
            self.event.set()


async def publish_case(dsn: str, log_size: int, single_n: int, batch_n: int) -> dict[str, Any]:
    bus, sub_id = await fresh_bus(dsn)
    try:
        if log_size:
            await preload(dsn, sub_id, log_size, "completed")
        t0 = time.perf_counter()
        for i in range(single_n):
            await bus.publish(ScaleTick(i=i))
        single = single_n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for start in range(0, batch_n, 1000):
            await bus.publish_many(Envelope(ScaleTick(i=i)) for i in range(start, start + 1000))
        batch = batch_n / (time.perf_counter() - t0)
    finally:
        await bus.aclose()
    out = {"part": "publish", "log_events": log_size, "single_per_second": round(single)}
    out["batch_per_second"] = round(batch)
    print(json.dumps(out), flush=True)
    return out


_STATS = f"""
SELECT pg_current_wal_lsn()::text AS lsn,
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = '{SCHEMA}')::bigint
           AS dead,
       (SELECT count(*) FROM {SCHEMA}.deliveries WHERE status = 'completed') AS completed
"""


async def xmin_case(dsn: str, seconds: float, hold: bool) -> dict[str, Any]:
    done = Counter(10**12)
    bus, _ = await fresh_bus(dsn, done.hit)
    holder = await asyncpg.connect(dsn)
    try:
        if hold:
            await holder.execute("BEGIN; SELECT txid_current();")
        before = await _stats_other(dsn)
        worker = Worker(bus, concurrency=200, batch_size=100, poll_interval_seconds=1)
        task = asyncio.create_task(worker.run())
        published, t0 = 0, time.perf_counter()
        timeline: list[int] = []  # completed per second, one figure per 30 s
        mark, mark_count = t0, 0
        while time.perf_counter() - t0 < seconds:
            if time.perf_counter() - mark >= 30:
                timeline.append(round((done.count - mark_count) / (time.perf_counter() - mark)))
                mark, mark_count = time.perf_counter(), done.count
            if published - done.count > 20_000:
                await asyncio.sleep(0.01)
                continue
            await bus.publish_many(Envelope(ScaleTick(i=published + i)) for i in range(200))
            published += 200
        elapsed = time.perf_counter() - t0
        completed_in_run = done.count
        worker.stop()
        await asyncio.wait_for(task, 60)
        await asyncio.sleep(1.0)  # statistics of the closed connections reach the collector
        after = await _stats_other(dsn)
    finally:
        if hold:
            await holder.execute("ROLLBACK")
        await holder.close()
        await bus.aclose()
    wal = await _wal_between(dsn, after["lsn"], before["lsn"])
    out = {
        "part": "xmin",
        "held": hold,
        "seconds": seconds,
        "completed_per_second": round(completed_in_run / elapsed),
        "dead_tuples_at_end": after["dead"],
        "wal_bytes_per_delivery": round(wal / max(1, after["completed"] - before["completed"])),
        "completed_per_second_each_30s": timeline,
    }
    print(json.dumps(out), flush=True)
    return out


async def _stats_other(dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return dict(await conn.fetchrow(_STATS))
    finally:
        await conn.close()


async def _wal_between(dsn: str, after: str, before: str) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        return float(await conn.fetchval("SELECT $1::text::pg_lsn - $2::text::pg_lsn", after, before))
    finally:
        await conn.close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/bench_scale")
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--drain-n", type=int, default=10_000)
    p.add_argument("--log-size", type=int, default=1_000_000)
    p.add_argument("--single-n", type=int, default=2000)
    p.add_argument("--batch-n", type=int, default=20_000)
    p.add_argument("--xmin-seconds", type=float, default=120.0)
    p.add_argument("--only", default="backlog,publish,xmin")
    p.add_argument("--append-only", action="store_true", help="Bus(dsn, append_only=True).")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    parts = set(args.only.split(","))
    results: list[dict[str, Any]] = []
    if "backlog" in parts:
        for size in (int(s) for s in args.sizes.split(",")):
            results.append(await backlog_case(args.dsn, size, args.drain_n, args.append_only))
    if "publish" in parts:
        for log_size in (0, args.log_size):
            results.append(await publish_case(args.dsn, log_size, args.single_n, args.batch_n))
    if "xmin" in parts:
        for hold in (False, True):
            results.append(await xmin_case(args.dsn, args.xmin_seconds, hold))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")  # noqa: ASYNC240


if __name__ == "__main__":
    asyncio.run(main())
