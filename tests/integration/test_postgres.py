"""PostgreSQL features: transactions, concurrency, NOTIFY, migrations, plans."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter

import anyio
import anyio.lowlevel
import asyncpg
import pytest

from eventbus import BackendUnavailable, Context, Envelope, Worker
from eventbus.backends.base import Completion
from eventbus.errors import MigrationChecksumMismatch

from ..support.helpers import OrderPlaced, PaymentRequested, counts, drain


@pytest.fixture
async def pg_bus(pg_target):
    bus = pg_target.bus()
    await bus.migrate()
    yield bus
    await bus.aclose()


async def test_concurrent_publishers_of_one_key_get_one_row(pg_bus) -> None:
    async def publish(i: int, out: list) -> None:
        out.append(await pg_bus.publish(OrderPlaced(order_id=f"attempt-{i}"), key="same"))

    results: list = []
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(publish, i, results)
    assert len(results) == 20
    assert len({r.event_id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert (await pg_bus.status()).events == 1


async def test_publish_in_rolled_back_transaction_leaves_nothing(pg_bus, pg_target) -> None:
    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await drain(pg_bus)
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await pg_bus.publish(OrderPlaced(order_id="ghost"), connection=conn)
                raise RuntimeError("caller's business logic failed")
        async with conn.transaction():
            await pg_bus.publish(OrderPlaced(order_id="real"), connection=conn)
        schema = pg_target.schema
        assert await conn.fetchval(f'SELECT count(*) FROM "{schema}".events') == 1
        assert await conn.fetchval(f'SELECT count(*) FROM "{schema}".deliveries') == 1
    finally:
        await conn.close()


async def test_completion_that_cannot_commit_leaves_no_follow_ups(pg_bus, pg_target) -> None:
    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await drain(pg_bus)
    await pg_bus.publish(OrderPlaced(order_id="o-1"))
    (claimed,) = await pg_bus.backend.deliveries.claim(1, 1, 30, "00000000-0000-4000-8000-000000000001")
    s = pg_target.schema
    conn = await asyncpg.connect(pg_target.dsn)
    try:  # the follow-up insert fails inside the completing transaction
        await conn.execute(f"""
            CREATE FUNCTION "{s}".refuse() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'disk full'; END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON "{s}".events FOR EACH ROW
            WHEN (NEW.event_type = 'test.payment_requested') EXECUTE FUNCTION "{s}".refuse();
        """)
        follow = pg_bus.outgoing(PaymentRequested(order_id="o-1"))
        with pytest.raises(Exception, match="disk full"):
            await pg_bus.backend.deliveries.complete([Completion(claimed.id, claimed.lease_token, (follow,))])
        assert await conn.fetchval(f'SELECT count(*) FROM "{s}".events') == 1
        status = await conn.fetchval(f'SELECT status FROM "{s}".deliveries WHERE id = $1', claimed.id)
        assert status == "processing"
    finally:
        await conn.close()


async def test_four_worker_tasks_complete_each_delivery_once(pg_bus) -> None:
    runs: Counter[int] = Counter()

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        runs[ctx.delivery_id] += 1
        await anyio.lowlevel.checkpoint()

    await drain(pg_bus)
    await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(2000)])
    workers = [Worker(pg_bus, burst=True, concurrency=20, batch_size=10) for _ in range(4)]
    async with anyio.create_task_group() as tg:
        for w in workers:
            tg.start_soon(w.run)
    assert len(runs) == 2000 and set(runs.values()) == {1}
    assert sum(w.processed for w in workers) == 2000
    assert all(w.processed > 0 for w in workers)
    assert await counts(pg_bus) == {("h", "completed"): 2000}


async def test_two_worker_processes_complete_each_delivery_once(pg_target) -> None:
    bus = pg_target.bus()
    await bus.migrate()

    @bus.subscribe(OrderPlaced, name="count")  # the same subscription as counter_app's
    async def count(event: OrderPlaced, ctx: Context) -> None:
        raise AssertionError("runs only in the worker processes")

    conn = await asyncpg.connect(pg_target.dsn)
    try:
        await conn.execute(f'CREATE TABLE "{pg_target.schema}".handler_runs (delivery_id bigint, pid int)')
        await bus.register()
        await bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(2000)])
        cmd = [
            sys.executable,
            "-m",
            "eventbus",
            "worker",
            "tests.apps.counter_app:bus",
            "--burst",
            "--concurrency",
            "10",
            "--batch-size",
            "10",
        ]
        procs = [subprocess.Popen(cmd, env=pg_target.env()) for _ in range(2)]
        try:
            for p in procs:
                assert p.wait(timeout=90) == 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        rows = await conn.fetch(
            f"SELECT delivery_id, count(*) AS n, count(DISTINCT pid) "
            f'FROM "{pg_target.schema}".handler_runs GROUP BY 1'
        )
        assert len(rows) == 2000 and {r["n"] for r in rows} == {1}
        pids = await conn.fetchval(f'SELECT count(DISTINCT pid) FROM "{pg_target.schema}".handler_runs')
        assert pids == 2
        assert await counts(bus) == {("count", "completed"): 2000}
    finally:
        await conn.close()
        await bus.aclose()


async def test_idle_worker_wakes_on_notify_well_before_the_poll(pg_bus) -> None:
    handled = anyio.Event()
    latencies: list[float] = []
    published_at: list[float] = []

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        latencies.append(time.monotonic() - published_at[-1])
        handled.set()

    worker = Worker(pg_bus, poll_interval_seconds=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.5)  # idle: listening, nothing to do
        for i in range(5):
            handled = anyio.Event()
            published_at.append(time.monotonic())
            await pg_bus.publish(OrderPlaced(order_id=str(i)))
            with anyio.fail_after(5):
                await handled.wait()
        worker.stop()
    assert max(latencies) < 1.0  # the poll interval is 30 s


async def test_migrate_twice_is_a_no_op_and_edits_are_refused(pg_target) -> None:
    bus = pg_target.bus()
    try:
        from eventbus.backends._migrations import discover

        assert await bus.migrate() == [m.name for m in discover("postgres")]
        assert await bus.migrate() == []
        conn = await asyncpg.connect(pg_target.dsn)
        try:
            await conn.execute(
                f'UPDATE "{pg_target.schema}".schema_migrations SET checksum = $1 WHERE version = 1', "0" * 64
            )
        finally:
            await conn.close()
        with pytest.raises(MigrationChecksumMismatch):
            await bus.migrate()
    finally:
        await bus.aclose()


async def test_raw_undecodable_rows_go_dead_and_healthy_ones_flow(pg_bus, pg_target) -> None:
    handled: list[str] = []

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        handled.append(event.order_id)

    await drain(pg_bus)
    s = pg_target.schema
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        await conn.execute(f"""
            WITH e AS (INSERT INTO "{s}".events (event_type, payload)
                       VALUES ('test.order_placed', '\\xff00'::bytea),
                              ('test.order_placed', convert_to('{{"order_id": [1]}}', 'UTF8')),
                              ('other.type', convert_to('{{"order_id": "x"}}', 'UTF8'))
                       RETURNING id)
            INSERT INTO "{s}".deliveries (event_id, subscription_id) SELECT id, 1 FROM e""")
    finally:
        await conn.close()
    await pg_bus.publish(OrderPlaced(order_id="healthy"))
    await drain(pg_bus)
    assert handled == ["healthy"]
    dead = await pg_bus.dead_letters()
    assert len(dead) == 3
    assert all(d.attempts == 1 and (d.last_error or "").startswith("DecodeError") for d in dead)


def _nodes(plan: dict) -> list[dict]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _nodes(child)
    return out


async def test_claim_and_complete_plans_stay_on_indexes(pg_bus, pg_target) -> None:
    """The claim reads about a batch from the claim-order index, with mixed
    priorities; completion goes by primary key even when the statistics say no
    row is processing."""
    import json

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await drain(pg_bus)
    await pg_bus.publish_many(
        [Envelope(OrderPlaced(order_id=str(i)), priority=i % 10) for i in range(20_000)]
    )
    q = pg_bus.backend.db.q
    widest = 9 * pg_bus.backend.db.priority_step
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        s = pg_target.schema
        await conn.execute(f'ANALYZE "{s}".deliveries, "{s}".events')  # all pending now
        token = "00000000-0000-4000-8000-000000000000"
        tx = conn.transaction()
        await tx.start()
        claim = json.loads(
            await conn.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {q['claim']}",
                1,
                100,
                30.0,
                token,
                "00000000-0000-4000-8000-000000000001",
                widest,
            )
        )[0]["Plan"]
        ids = [r[0] for r in await conn.fetch(q["claim"], 1, 500, 30.0, token, token, widest)]
        complete = json.loads(
            await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {q['complete']}", ids, token)
        )[0]["Plan"]
        await tx.rollback()
    finally:
        await conn.close()
    claim_nodes = _nodes(claim)
    # A scan of an empty chunk of the log (the one created ahead) reads nothing.
    assert not [
        n
        for n in claim_nodes
        if n["Node Type"] == "Seq Scan" and n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
    ]
    (pending,) = [n for n in claim_nodes if n.get("Index Name") == "deliveries_claim_order"]
    assert pending["Actual Rows"] <= 300  # a batch of 100, not the 20,000 backlog
    complete_nodes = _nodes(complete)
    assert {n.get("Index Name") for n in complete_nodes} >= {"deliveries_pkey"}
    assert not [n for n in complete_nodes if n["Node Type"] in ("Seq Scan", "Nested Loop")]
    assert complete["Node Type"] == "ModifyTable"


async def test_the_pending_backlog_is_indexed_once_and_its_readers_probe_the_index(pg_bus, pg_target) -> None:
    """One index holds the whole pending backlog (the claim order); the next due time, the
    oldest pending age and the rollup's queue sample read the first entries of it and of
    the narrow index of rows with a priority wait, never the backlog, with mixed
    priorities and rows not due."""
    import json

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    ids = await pg_bus.register()
    await pg_bus.publish_many(
        [
            Envelope(OrderPlaced(order_id=str(i)), priority=i % 10, delay=3600 if i % 7 == 0 else None)
            for i in range(5000)
        ]
    )
    q = pg_bus.backend.db.q
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        s = pg_target.schema
        await conn.execute(f'ANALYZE "{s}".deliveries')
        indexes = {
            r[0]
            for r in await conn.fetch(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = $1::regclass",
                f'"{s}".deliveries',
            )
        }
        cursor = await conn.fetchval(f'SELECT run_at FROM "{s}".deliveries ORDER BY id LIMIT 1 OFFSET 2500')
        plans = [
            json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))[0]["Plan"]
            for sql, args in (
                (q["next_run_in"], (ids["h"], None)),
                (q["next_run_in"], (ids["h"], cursor)),
                (q["status_oldest_pending"], ()),
            )
        ]
        tx = conn.transaction()  # the minute's queue sample (counted up to 10), not kept
        await tx.start()
        sample = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {q['rollup_sample']}", 0.0, 10)
        await tx.rollback()
    finally:
        await conn.close()
    sample_plan = json.loads(sample)[0]["Plan"]
    sample_reads = [n for n in _nodes(sample_plan) if n.get("Relation Name") == "deliveries"]
    # the capped count reads 10 rows however it goes; the oldest due age one entry of each index
    assert all(n["Actual Rows"] <= 10 for n in sample_reads)
    assert {n.get("Index Name") for n in sample_reads} >= {
        "deliveries_claim_order",
        "deliveries_pending_prioritised",
    }
    assert {i.split(".")[-1] for i in indexes} == {
        "deliveries_pkey",
        "deliveries_event_subscription",
        "deliveries_claim_order",
        "deliveries_pending_prioritised",
        "deliveries_lease_until",
        "deliveries_dead",
        "deliveries_dead_newest",
        "deliveries_cancelled",
        "deliveries_one_per_key",
        "deliveries_key_order",
    }
    for plan in plans:
        reads = [n for n in _nodes(plan) if n.get("Relation Name") == "deliveries" and n.get("Actual Loops")]
        assert {n["Node Type"] for n in reads} <= {"Index Scan", "Index Only Scan"}
        probed = {n["Index Name"] for n in reads}
        assert probed == {"deliveries_claim_order", "deliveries_pending_prioritised"}
        assert all(n["Actual Rows"] <= 1 for n in reads)  # the first entry, not the backlog


async def test_event_committed_behind_the_claim_cursor_is_still_delivered(pg_bus, pg_target) -> None:
    """A publish transaction that commits late gets a run_at older than rows already
    claimed; claiming from a cursor must not leave it behind."""
    handled: list[str] = []
    commit_late = anyio.Event()

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        handled.append(event.order_id)
        if len(handled) == 250:
            commit_late.set()

    await pg_bus.register()
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await pg_bus.publish(OrderPlaced(order_id="late"), connection=conn)  # run_at = now
        await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(1000)])

        async def commit() -> None:
            await commit_late.wait()
            await tx.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit)
            await Worker(pg_bus, burst=True, concurrency=20, batch_size=20).run()
    finally:
        await conn.close()
    assert "late" in handled and len(handled) == 1001


async def test_lease_renewal_does_not_wait_for_a_row_held_by_a_result_write(pg_bus, pg_target) -> None:
    """A renewal that waited for rows its own worker's result write holds could lock
    the rows of one batch in the opposite order to that write and deadlock; it skips
    them instead, and still counts them as held."""

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    sub_id = (await pg_bus.register())["h"]
    await pg_bus.publish_many([OrderPlaced(order_id="a"), OrderPlaced(order_id="b")])
    first, second = await pg_bus.backend.deliveries.claim(
        sub_id, 10, 30.0, "00000000-0000-0000-0000-000000000001"
    )
    holder = await asyncpg.connect(pg_target.dsn)
    try:
        tx = holder.transaction()
        await tx.start()  # a result write in flight, holding the first row
        await holder.execute(
            f'SELECT 1 FROM "{pg_target.schema}".deliveries WHERE id = $1 FOR UPDATE', first.id
        )
        with anyio.fail_after(5):
            kept = await pg_bus.backend.deliveries.extend([first.id, second.id], first.lease_token, 60.0)
        await tx.rollback()
        rows = await holder.fetch(
            f'SELECT id, lease_until - now() AS left FROM "{pg_target.schema}".deliveries WHERE id = ANY($1)',
            [first.id, second.id],
        )
        leases = {r["id"]: r["left"] for r in rows}
    finally:
        await holder.close()
    assert kept == {first.id, second.id}
    assert (
        leases[second.id].total_seconds() > 50 > leases[first.id].total_seconds()
    )  # only the free one renewed


async def test_a_broken_publish_connection_is_replaced(pg_target) -> None:
    """Lone publishes go through one connection kept aside from the pool; when the
    server ends it, one publish may fail as unavailable and the next takes another."""
    bus = pg_target.bus()
    try:
        await bus.migrate()
        await bus.publish(OrderPlaced(order_id="before"))
        pid = bus.backend.db.held_conn.get_server_pid()
        admin = await asyncpg.connect(pg_target.dsn)
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        outcomes = []
        for i in range(2):
            try:
                outcomes.append(await bus.publish(OrderPlaced(order_id=f"after-{i}")))
            except BackendUnavailable as exc:
                outcomes.append(exc)
        assert not isinstance(outcomes[-1], Exception)
        published = 1 + sum(not isinstance(o, Exception) for o in outcomes)
        assert (await bus.status()).events == published
        assert bus.backend.db.held_conn.get_server_pid() != pid
    finally:
        await bus.aclose()


@pytest.mark.parametrize("append_only", [False, True], ids=["default", "append-only"])
async def test_a_pool_of_one_connection_keeps_none_aside_for_publishing(pg_target, append_only: bool) -> None:
    # On the append-only path a ring claim also makes the outcome log's days: on its own connection.
    bus = pg_target.bus(min_pool_size=1, max_pool_size=1, append_only=append_only)
    handled: list[str] = []

    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        handled.append(event.order_id)

    try:
        await bus.migrate()
        await bus.register()
        with anyio.fail_after(20):
            await bus.publish(OrderPlaced(order_id="only"))
            await Worker(bus, burst=True).run()
    finally:
        await bus.aclose()
    assert handled == ["only"]


async def test_closing_the_bus_lets_a_publish_in_flight_finish(pg_target) -> None:
    bus = pg_target.bus()
    await bus.migrate()
    await bus.publish(OrderPlaced(order_id="first"))  # the held connection exists now
    in_flight = asyncio.ensure_future(bus.publish(OrderPlaced(order_id="in-flight")))
    await asyncio.sleep(0)  # its statement is on the wire
    await bus.aclose()
    result = await in_flight
    assert not result.duplicate
    check = pg_target.bus()
    try:
        assert (await check.status()).events == 2
    finally:
        await check.aclose()
