"""The operator's reads on the append-only path at scale, beside the default path.

    python -m benchmarks.dashboard_ring --dsn postgresql://postgres@127.0.0.1:5432/bench_viewscale \
        --completed 300000 --json benchmarks/results/dashboard_ring.json \
        --out benchmarks/results/dashboard_ring.md

Recreates the database (its name must start with ``bench_``) and seeds two
schemas the same way, one per path: ``plain`` for ``Bus(dsn)``, ``ring`` for
``Bus(dsn, append_only=True)``. ``--completed`` completed deliveries over four
subscriptions (one event each, a second apart, so the outcome log spans a few
daily partitions) are loaded with set-based SQL in the shape each path writes
them: rows of ``deliveries`` on the default path, ``completed`` outcome rows of
``delivery_log`` on the append-only one (ids from the deliveries sequence, as
the ring takes them). A tenth as many dead letters (``deliveries`` on both
paths) follow. Then, through the bus's own statements: ``--live`` more
events are published (the ring's ready rows on the append-only path), some of
them claimed (processing; a few under a lease already run out: stuck), some of
the claimed failed once (retrying, in ``deliveries``) or for good (dead).
``VACUUM ANALYZE`` ends the seed; the two schemas then hold the same ids.

Each read the dashboard and the CLI make (``bus.backend.inspect``: status,
health, subscriptions, the deliveries list newest first and filtered, its
capped counts, one delivery, an event's page and chain, the id walk of a bulk
action; and the worker's per-minute queue sample) is called once to warm up
and ``--runs`` more times on each path; the table shows the medians side by
side, and whether both paths answered the same (results compared with their
timestamps of a claim or a completion left out where the paths write them at
different moments). ``--baseline`` shows an earlier run's ``--json`` beside
(the code before a change, run with the same command); ``--reuse`` measures
the seed an earlier run left instead of seeding again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from benchmarks.peers.common import recreate_database
from eventbus import Bus, Context, Event
from eventbus.backends.ports.delivery import Failure
from eventbus.types import DeliveryFilter

SCHEMAS = {"plain": False, "ring": True}
CHUNK = 100_000


class OrderPlaced(Event, event_type="bench.order_placed"):
    order_id: str


class OrderPaid(Event, event_type="bench.order_paid"):
    order_id: str


class OrderShipped(Event, event_type="bench.order_shipped"):
    order_id: str


class OrderRefunded(Event, event_type="bench.order_refunded"):
    order_id: str


SUBSCRIPTIONS: list[tuple[str, type[Event]]] = [
    ("billing", OrderPlaced),
    ("ledger", OrderPaid),
    ("shipping", OrderShipped),
    ("refunds", OrderRefunded),
]


def make_bus(dsn: str, schema: str) -> Bus:
    bus = Bus(dsn, schema=schema, migrate=True, append_only=SCHEMAS[schema], max_pool_size=4)
    for name, cls in SUBSCRIPTIONS:

        async def handle(event: Event, ctx: Context) -> None:
            pass

        bus.subscribe(cls, name=name)(handle)
    return bus


# $1 first number, $2 how many, $3 the total, $4 the event types, $5 when the seed began.
EVENTS = """
INSERT INTO {s}.events (event_type, key, payload, created_at, correlation_id)
SELECT ($4::text[])[1 + g % 4], 'o-' || g,
       convert_to('{{"order_id":"o-' || g || '"}}', 'UTF8'),
       $5::timestamptz - ($3::int - g) * interval '1 second',
       NULL
FROM generate_series($1::int, $1::int + $2::int - 1) g
RETURNING id
"""

# The deliveries of the events $1..$2 as the default path leaves them once completed.
PLAIN_COMPLETED = """
INSERT INTO {s}.deliveries (event_id, subscription_id, status, attempts, run_at, worker_id, updated_at)
SELECT e.id, s.id, 'completed', 1, e.created_at, $3::uuid, e.created_at + interval '2 seconds'
FROM {s}.events e JOIN {s}.subscriptions s ON s.event_type = e.event_type
WHERE e.id BETWEEN $1 AND $2
ORDER BY e.id
"""

# ... and as the append-only path does: an outcome row per delivery, its id from the sequence.
RING_COMPLETED = """
INSERT INTO {s}.delivery_log (claimed_on, delivery_id, subscription_id, event_id, status, worker_id,
                              enqueued_at, claimed_at, finished_at)
SELECT ((e.created_at + interval '1 second') AT TIME ZONE 'UTC')::date,
       nextval(pg_get_serial_sequence('{s}.deliveries', 'id')), s.id, e.id, 'completed', $3::uuid,
       e.created_at, e.created_at + interval '1 second', e.created_at + interval '2 seconds'
FROM {s}.events e JOIN {s}.subscriptions s ON s.event_type = e.event_type
WHERE e.id BETWEEN $1 AND $2
ORDER BY e.id
"""

# Dead letters live in deliveries on both paths.
DEAD = """
INSERT INTO {s}.deliveries (event_id, subscription_id, status, attempts, run_at, last_error, updated_at)
SELECT e.id, s.id, 'dead', 5, e.created_at,
       (ARRAY['KeyError: order ', 'TimeoutError: shipment ', 'ValueError: refund '])[1 + e.id % 3]
           || e.id || ' not found',
       e.created_at + interval '30 seconds'
FROM {s}.events e JOIN {s}.subscriptions s ON s.event_type = e.event_type
WHERE e.id BETWEEN $1 AND $2
ORDER BY e.id
"""

CHAINS = "UPDATE {s}.events SET correlation_id = id - id % 10 WHERE id % 10 IN (1, 2, 3) AND id > 10"


async def seed(dsn: str, completed: int, live: int) -> dict[str, Any]:
    """Both schemas, the same rows in each; the seconds each took."""
    await recreate_database(dsn)
    times = {}
    began = datetime.now(UTC)  # the same history in both schemas
    for schema in SCHEMAS:
        t0 = time.perf_counter()
        bus = make_bus(dsn, schema)
        try:
            ids = await bus.register()
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(
                    f"SELECT {schema}.delivery_log_make((now() AT TIME ZONE 'UTC')::date - d) "
                    "FROM generate_series(1, $1::int) d",
                    completed // 86_400 + 2,
                )
                types = [cls.__event_type__ for _, cls in SUBSCRIPTIONS]  # type: ignore[attr-defined]
                dead = completed // 10
                total = completed + dead
                load = RING_COMPLETED if SCHEMAS[schema] else PLAIN_COMPLETED
                worker = uuid.uuid4()
                for start in range(1, total + 1, CHUNK):
                    n = min(CHUNK, total + 1 - start)
                    await conn.execute(EVENTS.format(s=schema), start, n, total, types, began)
                for start in range(1, completed + 1, CHUNK):
                    last = min(completed, start + CHUNK - 1)
                    await conn.execute(load.format(s=schema), start, last, worker)
                await conn.execute(DEAD.format(s=schema), completed + 1, total)
                await conn.execute(CHAINS.format(s=schema))
            finally:
                await conn.close()
            await live_rows(bus, ids, live)
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f"VACUUM ANALYZE {schema}.events, {schema}.deliveries")
                await conn.execute(
                    f"ANALYZE {schema}.delivery_log, {schema}.ring_ready, {schema}.ring_claims"
                )
            finally:
                await conn.close()
        finally:
            await bus.aclose()
        times[schema] = time.perf_counter() - t0
        print(f"seeded {schema} in {times[schema]:.0f} s", flush=True)
    return times


async def live_rows(bus: Bus, ids: dict[str, int], live: int) -> None:
    """Publish ``live`` events through the bus, claim some, fail a few (once, for good)."""
    per = live // len(SUBSCRIPTIONS)
    for name, cls in SUBSCRIPTIONS:
        await bus.publish_many([cls(order_id=f"live-{name}-{i}") for i in range(per)])  # type: ignore[call-arg]
    store = bus.backend.deliveries
    worker = str(uuid.uuid4())
    for name, _ in SUBSCRIPTIONS:
        sub = ids[name]
        held = await store.claim(sub, per // 4, 600.0, worker)
        await store.claim(sub, per // 20, 0.5, worker)  # their lease runs out: stuck
        retried = held[: per // 20]
        dead = held[per // 20 : per // 10]
        failures = [
            Failure(d.id, d.lease_token, d in dead, 0.0 if d in dead else 3600.0, "KeyError",
                    f"order {d.id} not found", "", 0.01, worker)
            for d in retried + dead
        ]  # fmt: skip
        await store.fail(failures)
    await asyncio.sleep(1.0)


# -- the reads -------------------------------------------------------------------


async def sample(dsn: str) -> dict[str, Any]:
    """Ids of the seed (the same in both schemas) the reads ask for."""
    conn = await asyncpg.connect(dsn)
    try:
        s = "plain"
        top = await conn.fetchval(f"SELECT max(id) FROM {s}.deliveries WHERE status = 'completed'")
        return {
            "completed_id": top - 1000,
            "pending_id": await conn.fetchval(f"SELECT max(id) FROM {s}.deliveries WHERE status = 'pending'"),
            "dead_id": await conn.fetchval(f"SELECT max(id) FROM {s}.deliveries WHERE status = 'dead'"),
            "middle_id": top // 2,
            "event_id": await conn.fetchval(f"SELECT event_id FROM {s}.deliveries WHERE id = $1", top - 1000),
            "chain_id": await conn.fetchval(
                f"SELECT max(correlation_id) FROM {s}.events WHERE correlation_id IS NOT NULL"
            ),
        }
    finally:
        await conn.close()


def reads(bus: Bus, ids: dict[str, Any]) -> dict[str, Callable[[], Awaitable[Any]]]:
    ins = bus.backend.inspect
    F = DeliveryFilter
    minute = [int(time.time() // 60) * 60 - 10_000 * 60]

    async def queue_sample() -> bool:
        minute[0] -= 60  # a minute not sampled yet, each call
        return await bus.backend.rollup.sample_queues(minute[0], 10_000)

    return {
        "status": lambda: ins.status(),
        "status (window 10,000)": lambda: ins.status(10_000),
        "health": lambda: ins.health(),
        "subscriptions": lambda: ins.subscriptions(),
        "list newest": lambda: ins.find(F(), 50),
        "list newest, deep cursor": lambda: ins.find(F(), 50, ids["middle_id"]),
        "list completed": lambda: ins.find(F(status="completed"), 50),
        "list pending": lambda: ins.find(F(status="pending"), 50),
        "list processing": lambda: ins.find(F(status="processing"), 50),
        "list dead": lambda: ins.find(F(status="dead"), 50),
        "list stuck": lambda: ins.find(F(condition="stuck"), 50),
        "list retrying": lambda: ins.find(F(condition="retrying"), 50),
        "list subscription": lambda: ins.find(F(subscription="ledger"), 50),
        "list subscription + completed": lambda: ins.find(F(subscription="ledger", status="completed"), 50),
        "list event type": lambda: ins.find(F(event_type="bench.order_shipped"), 50),
        "count all (cap 10,000)": lambda: ins.count(F(), 10_000),
        "count completed": lambda: ins.count(F(status="completed"), 10_000),
        "count pending": lambda: ins.count(F(status="pending"), 10_000),
        "count processing": lambda: ins.count(F(status="processing"), 10_000),
        "count subscription": lambda: ins.count(F(subscription="ledger"), 10_000),
        "show completed": lambda: ins.show(ids["completed_id"]),
        "show pending": lambda: ins.show(ids["pending_id"]),
        "show dead": lambda: ins.show(ids["dead_id"]),
        "event page": lambda: ins.event(ids["event_id"]),
        "chain": lambda: ins.chain(ids["chain_id"]),
        "id walk pending (bulk action)": lambda: ins.delivery_ids(F(status="pending"), 500),
        "id walk subscription": lambda: ins.delivery_ids(F(subscription="billing"), 500),
        "queue sample (worker, per minute)": queue_sample,
    }


# Set when a claim or completion happened, which the paths do at different moments of the seed.
VOLATILE = {"updated_at", "lease_until", "worker_id", "heartbeat_at", "silent_seconds", "last_seen_at",
            "worker_seen_at", "oldest_pending_seconds", "lag_seconds", "tables", "horizon", "run_at",
            "started_at", "created_at", "elapsed_seconds", "failed_at"}  # fmt: skip


def comparable(value: Any) -> Any:
    """A read's answer without what differs between paths by construction (see VOLATILE)."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.structs.asdict(value)
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list | tuple):
        return [comparable(v) for v in value]
    return value


async def measure(dsn: str, ids: dict[str, Any], runs: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for schema in SCHEMAS:
        bus = make_bus(dsn, schema)
        try:
            await bus.backend.inspect.subscriptions()
            for name, call in reads(bus, ids).items():
                first = await call()
                times = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    await call()
                    times.append((time.perf_counter() - t0) * 1000)
                row = out.setdefault(name, {})
                row[schema] = round(statistics.median(times), 2)
                row[f"{schema}_answer"] = comparable(first)
        finally:
            await bus.aclose()
    for row in out.values():
        row["same"] = row.pop("plain_answer") == row.pop("ring_answer")
    return out


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, seeded: dict[str, float]) -> str:
    lines = [
        "# The operator's reads on the append-only path",
        "",
        f"`{' '.join(args.argv)}`",
        "",
        f"{args.completed:,} completed deliveries, {args.completed // 10:,} dead letters, {args.live:,} live "
        f"events (pending, processing, stuck, retrying, dead); median of {args.runs} calls, ms. "
        f"Seeded in {seeded.get('plain', 0):.0f} s (default path) and {seeded.get('ring', 0):.0f} s "
        "(append-only). *same*: both paths answered alike (claim and completion times left out).",
        "",
    ]
    base = json.loads(args.baseline.read_text())["reads"] if args.baseline else None
    if base is None:
        lines += ["| read | default path | append-only | same |", "|---|---:|---:|:---:|"]
    else:
        lines += [
            f"Before: `{args.baseline}` (an earlier run, same command), shown beside.",
            "",
            "| read | default path | append-only | same | before: default | before: append-only |",
            "|---|---:|---:|:---:|---:|---:|",
        ]
    for name, r in results.items():
        line = f"| {name} | {r['plain']:.2f} | {r['ring']:.2f} | {'yes' if r['same'] else '**no**'} |"
        if base is not None:
            b = base.get(name)
            line += " — | — |" if b is None else f" {b['plain']:.2f} | {b['ring']:.2f} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


async def main(args: argparse.Namespace) -> None:
    if not args.dsn.rsplit("/", 1)[-1].startswith("bench_"):
        raise SystemExit("the database name must start with bench_")
    seeded = {} if args.reuse else await seed(args.dsn, args.completed, args.live)
    ids = await sample(args.dsn)
    results = await measure(args.dsn, ids, args.runs)
    text = report(results, args, seeded)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        figures = {"completed": args.completed, "live": args.live, "runs": args.runs, "seeded_s": seeded,
                   "reads": results}  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/bench_viewscale")
    parser.add_argument("--completed", type=int, default=300_000)
    parser.add_argument("--live", type=int, default=4_000, help="events published through the bus")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="measure the seed of an earlier run again")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--baseline", type=Path, help="the --json of an earlier run, shown beside")
    args = parser.parse_args()
    args.argv = ["python -m benchmarks.dashboard_ring", *sys.argv[1:]]
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
