"""The PostgreSQL event log in chunks of ids: rotation, drops that return space, what must stay."""

from __future__ import annotations

import functools
import json
from datetime import timedelta

import anyio
import asyncpg
import pytest

from eventbus import Context, DeadLetter, RetryPolicy
from eventbus.backends.postgres import retention as pg_retention
from eventbus.retention import Retention
from eventbus.types import DeliveryFilter

from ..support.helpers import OrderPlaced, Shipped, drain
from ..support.plans import migrated, partitions_read, scans, subscription

KEEP = timedelta(days=1)
ROTATE = Retention(completed_retention=KEEP, event_chunk_seconds=0, event_chunk_ids=100)
"""A pass that closes the open chunk (whatever its age) and makes chunks of 100 ids."""
DROP = Retention(completed_retention=timedelta(0), dedup_window=timedelta(0), event_chunk_ids=100)
"""A pass that closes the open chunk and drops every closed one it may."""


@pytest.fixture
async def pg_bus(pg_target):
    bus = pg_target.bus()
    await bus.migrate()
    yield bus
    await bus.aclose()


@pytest.fixture
async def sql(pg_target):
    conn = await asyncpg.connect(pg_target.dsn)
    await conn.execute(f'SET search_path = "{pg_target.schema}"')
    yield conn
    await conn.close()


async def _chunks(sql: asyncpg.Connection) -> list[tuple[str, int, int, bool]]:
    """(name, lo, hi, closed) of each chunk, oldest first."""
    rows = await sql.fetch(
        "SELECT name, lo, hi, closed_at IS NOT NULL AS closed FROM event_chunks ORDER BY lo"
    )
    return [(r["name"], r["lo"], r["hi"], r["closed"]) for r in rows]


async def _open(sql: asyncpg.Connection) -> tuple[str, int, int, bool]:
    """The chunk new events go to."""
    (chunk,) = [
        c
        for c in await _chunks(sql)
        if c[0]
        == await sql.fetchval(
            "SELECT name FROM event_chunks WHERE opened_at IS NOT NULL AND closed_at IS NULL"
        )
    ]
    return chunk


async def _exists(sql: asyncpg.Connection, table: str) -> bool:
    return await sql.fetchval("SELECT to_regclass($1) IS NOT NULL", table)


async def test_a_chunk_closes_by_age_and_the_ids_jump_to_the_next(pg_bus, sql) -> None:
    first = (await pg_bus.publish(OrderPlaced(order_id="a"))).event_id
    kept = await pg_bus.prune(retention=Retention(completed_retention=KEEP, event_chunk_ids=100))
    assert kept.event_chunks == 0 and [c[3] for c in await _chunks(sql)] == [False, False]  # a day not over
    await pg_bus.prune(retention=ROTATE)
    (_, _, old_hi, closed), (new, new_lo, _, _), ahead = await _chunks(sql)
    assert closed and ahead[2] - ahead[1] == 100  # the next chunk is ready ahead
    second = (await pg_bus.publish(OrderPlaced(order_id="b"))).event_id
    assert first < old_hi <= second == new_lo
    assert await sql.fetchval("SELECT tableoid::regclass::text FROM events WHERE id = $1", second) == new
    assert (await pg_bus.trace(first)).id == first  # the closed chunk is still read


async def test_a_worker_back_after_days_idle_closes_the_stale_chunk_at_its_first_pass(pg_bus, sql) -> None:
    await pg_bus.publish(OrderPlaced(order_id="before"))
    await sql.execute(
        "UPDATE event_chunks SET opened_at = now() - interval '3 days' WHERE opened_at IS NOT NULL"
    )
    stale = (await _open(sql))[0]
    late = await pg_bus.publish(OrderPlaced(order_id="while idle"))  # still lands, in the stale chunk
    await pg_bus.prune(retention=Retention())  # the defaults: a chunk a day, kept a week
    assert (await _open(sql))[0] != stale
    assert (await pg_bus.publish(OrderPlaced(order_id="after"))).event_id > late.event_id


async def test_a_chunk_closes_when_nearly_full_and_a_publish_past_every_chunk_still_lands(
    pg_bus, sql
) -> None:
    await pg_bus.prune(retention=ROTATE)
    await pg_bus.prune(retention=ROTATE)  # the open chunk has 100 ids from here
    name, lo, hi, _ = await _open(sql)
    assert hi - lo == 100
    await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(89)])
    young = Retention(completed_retention=KEEP, event_chunk_ids=100)
    await pg_bus.prune(retention=young)
    assert (await _open(sql))[0] == name  # 89% full: stays open
    await pg_bus.publish(OrderPlaced(order_id="90th"))
    await pg_bus.prune(retention=young)
    assert (await _open(sql))[0] != name  # 90% full: closed
    # 250 events between two passes overrun the open chunk and the one ahead:
    # the rest land in the default partition, and the next pass starts a chunk past them.
    results = await pg_bus.publish_many([OrderPlaced(order_id=f"x{i}") for i in range(250)])
    ids = [r.event_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 250
    assert await sql.fetchval("SELECT count(*) FROM events_kept") > 0
    await pg_bus.prune(retention=young)
    assert (await _chunks(sql))[-1][1] > max(ids)
    assert (await pg_bus.publish(OrderPlaced(order_id="next"))).event_id > max(ids)


async def test_an_expired_chunk_is_dropped_with_its_keys(pg_bus, sql) -> None:
    await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(20)])
    keyed = await pg_bus.publish(OrderPlaced(order_id="k"), key="k")
    await pg_bus.prune(retention=ROTATE)
    old = (await _chunks(sql))[0][0]
    dry = await pg_bus.prune(dry_run=True, retention=DROP)
    # The chunk of the events, and the empty one this pass closes.
    assert (dry.events, dry.event_chunks) == (21, 2) and await _exists(sql, old)
    report = await pg_bus.prune(retention=DROP)  # and one more empty chunk (a dry run closes chunks)
    assert (report.events, report.event_chunks) == (21, 3)
    assert not await _exists(sql, old)  # the table is gone: its space with it
    assert await sql.fetchval("SELECT count(*) FROM event_keys") == 0
    assert await sql.fetchval("SELECT count(*) FROM events") == 0
    again = await pg_bus.publish(OrderPlaced(order_id="k"), key="k")
    assert not again.duplicate and again.event_id > keyed.event_id


async def test_a_chunk_pinned_by_dead_letters_keeps_them_replayable(pg_bus, sql) -> None:
    refuse = [True]

    @pg_bus.subscribe(OrderPlaced, name="h", retry=RetryPolicy(max_attempts=1))
    async def h(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id.startswith("bad") and refuse[0]:
            raise DeadLetter("refused")

    await pg_bus.register()
    await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(30)])
    bad = [r.event_id for r in await pg_bus.publish_many([OrderPlaced(order_id=f"bad{i}") for i in range(2)])]
    await drain(pg_bus)
    await pg_bus.prune(retention=ROTATE)
    old = (await _chunks(sql))[0][0]
    # At most batch_size * max_batches events may move out of a chunk: here one, and 2 must stay
    # (and the 30 whose deliveries this pass has not reached yet).
    keep_dead = Retention(completed_retention=timedelta(0), dead_retention=None, batch_size=1, max_batches=1)
    pinned = await pg_bus.prune(retention=keep_dead)
    assert pinned.events == 0 and await _exists(sql, old)
    report = await pg_bus.prune(retention=Retention(completed_retention=timedelta(0), dead_retention=None))
    assert report.events == 30 and not await _exists(sql, old)
    # The two events moved out of the chunk under their ids; their dead letters replay.
    assert sorted(await sql.fetch("SELECT id FROM events_kept ORDER BY id")) == [(i,) for i in bad]
    assert (await pg_bus.event(bad[0])).id == bad[0]
    refuse[0] = False
    assert await pg_bus.replay(DeliveryFilter(status="dead")) == 2
    await drain(pg_bus)
    assert {d.status for i in bad for d in (await pg_bus.trace(i)).deliveries} == {"completed"}


async def test_a_pinned_chunk_is_told_pinned_without_locking_the_log(pg_bus, pg_target, sql) -> None:
    """A chunk more of whose events must stay than a pass may move is found pinned before the
    drop's transaction: a pass over it never takes the event log's lock, which every publish and
    claim waits for (here a reader holds the log, and the pass still says pinned, not busy)."""

    @pg_bus.subscribe(OrderPlaced, name="h", retry=RetryPolicy(max_attempts=1))
    async def h(event: OrderPlaced, ctx: Context) -> None:
        raise DeadLetter("refused")

    await pg_bus.register()
    await pg_bus.publish_many([OrderPlaced(order_id=f"bad{i}") for i in range(3)])
    await drain(pg_bus)
    await pg_bus.prune(retention=ROTATE)
    reader = await asyncpg.connect(pg_target.dsn)
    try:
        async with reader.transaction():
            await reader.execute(f'SELECT count(*) FROM "{pg_target.schema}".events')  # holds the log
            done = await pg_bus.backend.retention.prune_chunks(
                completed_seconds=0.0, dead_seconds=None, dedup_seconds=0.0, chunk_seconds=86400.0,
                chunk_ids=1 << 32, max_survivors=1,
            )  # fmt: skip
    finally:
        await reader.close()
    assert (done.pinned, done.busy, done.chunks) == (1, 0, 0)


async def test_dedup_holds_across_a_chunk_boundary(pg_bus, sql) -> None:
    first = await pg_bus.publish(OrderPlaced(order_id="a"), key="k")
    once = await pg_bus.publish(OrderPlaced(order_id="o"), key="o", once=True)
    await pg_bus.prune(retention=ROTATE)
    again = await pg_bus.publish(OrderPlaced(order_id="a"), key="k")
    assert again.duplicate and again.event_id == first.event_id
    results = [await pg_bus.publish(OrderPlaced(order_id=x), key=x) for x in ("k", "new", "new")]
    assert [r.duplicate for r in results] == [True, False, True]
    assert results[0].event_id == first.event_id and results[1].event_id == results[2].event_id
    # Inside the dedup window the keyed events outlive their chunk; past it they go, and
    # the key is free again, but a key kept with once=True holds for good.
    window = Retention(completed_retention=timedelta(0), dedup_window=timedelta(hours=1))
    report = await pg_bus.prune(retention=window)
    assert report.event_chunks >= 1 and report.events == 0
    assert (await pg_bus.publish(OrderPlaced(order_id="a"), key="k")).event_id == first.event_id
    report = await pg_bus.prune(retention=DROP)
    assert report.events >= 2
    fresh = await pg_bus.publish(OrderPlaced(order_id="a"), key="k")
    assert not fresh.duplicate and fresh.event_id != first.event_id
    kept = await pg_bus.publish(OrderPlaced(order_id="o"), key="o", once=True)
    assert kept.duplicate and kept.event_id == once.event_id


async def test_a_publish_racing_a_rotation_keeps_its_event_and_delivery(pg_bus, pg_target, sql) -> None:
    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await pg_bus.register()
    # A publish whose transaction drew its id in the open chunk and has not committed.
    racing = await asyncpg.connect(pg_target.dsn)
    try:
        tx = racing.transaction()
        await tx.start()
        db = pg_bus.backend.db
        racing_id = await racing.fetchval(
            db.q["publish_one"], "test.order_placed", None, b'{"order_id":"r"}', "{}", 0.0, None, None,
            None, db.channel, None, 1, 0, db.priority_step, False,
        )  # fmt: skip
        # Meanwhile other publishes and passes that close chunks and try to drop them.
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(pg_bus.publish_many, [OrderPlaced(order_id=f"{i}-{j}") for j in range(20)])
            for _ in range(3):
                tg.start_soon(functools.partial(pg_bus.prune, retention=DROP))
        held = (await _chunks(sql))[0][0]
        await pg_bus.prune(retention=DROP)
        assert await _exists(sql, held)  # the chunk with the open publish waits for it
        await tx.commit()
    finally:
        await racing.close()
    await pg_bus.prune(retention=DROP)  # now it may go, but the event has a pending delivery
    assert [d.status for d in (await pg_bus.trace(racing_id)).deliveries] == ["pending"]
    await drain(pg_bus)
    assert [d.status for d in (await pg_bus.trace(racing_id)).deliveries] == ["completed"]
    assert await sql.fetchval("SELECT count(*) FROM deliveries WHERE status <> 'completed'") == 0


async def test_a_chunk_drop_takes_the_log_before_the_chunk_as_a_claim_does(pg_bus, pg_target, sql) -> None:
    """A statement reading the log (a claim's join) locks the parent, then each chunk. A drop
    that locked its chunk first and then waited for the parent held the reader up until the
    drop's lock_timeout gave up, and the chunk stayed."""
    await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(5)])
    await pg_bus.prune(retention=ROTATE)
    old = (await _chunks(sql))[0][0]
    reader = await asyncpg.connect(pg_target.dsn)
    try:
        await reader.execute(f'SET search_path = "{pg_target.schema}"')
        tx = reader.transaction()
        await tx.start()
        await reader.execute("LOCK TABLE ONLY events IN ACCESS SHARE MODE")  # the reader's first lock
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(pg_bus.prune, retention=DROP))
            with anyio.fail_after(10):
                while not await sql.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.relation = 'events'::regclass AND NOT l.granted"
                    " AND a.query NOT LIKE '%rotate_event_chunks%')"
                ):
                    await anyio.sleep(0.01)
            # The drop waits for the parent: the reader's next locks, the chunks', are free
            # (well under the drop's own lock_timeout of 200 ms).
            await reader.execute("SET LOCAL lock_timeout = '100ms'")
            assert await reader.fetchval("SELECT count(*) FROM events") == 5
            await tx.commit()
    finally:
        await reader.close()
    await pg_bus.prune(retention=DROP)
    assert not await _exists(sql, old)


async def test_a_chunk_drop_reads_its_survivors_before_it_locks_the_log(pg_bus, pg_target, sql) -> None:
    """A chunk drop holds the log's parent, which every claim and publish waits for, for the DROP
    and the survivors' re-insert only: the survivors are read and copied before it. Here their
    read is held up by a transaction holding subscriptions (the read joins it); the drop then
    holds no lock of the log a reader waits for, and a read of the log (a claim's join) goes
    through. It held the parent through that read, and every claim waited."""

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await pg_bus.register()
    pending = (await pg_bus.publish(OrderPlaced(order_id="pending"))).event_id  # a survivor
    await pg_bus.publish(Shipped(order_id="k"), key="k")  # no delivery: it goes, its key first
    await pg_bus.prune(retention=ROTATE)
    old = (await _chunks(sql))[0][0]
    holder = await asyncpg.connect(pg_target.dsn)
    reader = await asyncpg.connect(pg_target.dsn)
    try:
        for conn in (holder, reader):
            await conn.execute(f'SET search_path = "{pg_target.schema}"')
        keys = holder.transaction()
        await keys.start()  # holds the key, so the pass stops in its key walk, past the pinned check
        await holder.execute("SELECT 1 FROM event_keys WHERE key = 'k' FOR UPDATE")
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(
                pg_bus.backend.retention.prune_chunks, completed_seconds=0.0, dead_seconds=None,
                dedup_seconds=0.0, chunk_seconds=86400.0, chunk_ids=100, max_survivors=10,
            ))  # fmt: skip
            with anyio.fail_after(10):
                while not await sql.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'transactionid'"
                    " AND NOT granted AND pid <> $1)",
                    holder.get_server_pid(),
                ):
                    await anyio.sleep(0.01)
            subs = reader.transaction()
            await subs.start()
            await reader.execute("LOCK TABLE subscriptions IN ACCESS EXCLUSIVE MODE")
            await keys.rollback()
            # The survivors' read waits for subscriptions (at most the drop's lock_timeout, 200 ms).
            with anyio.fail_after(10):
                while (
                    held := await sql.fetchrow(
                        "SELECT w.pid, EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = w.pid AND l.granted"
                        "   AND l.relation = 'events'::regclass AND l.mode <> 'AccessShareLock') AS log"
                        " FROM pg_locks w WHERE w.relation = 'subscriptions'::regclass AND NOT w.granted"
                    )
                ) is None:
                    await anyio.sleep(0.005)
            assert not held["log"], "the drop holds the event log while it reads its survivors"
            await reader.execute("SET LOCAL lock_timeout = '100ms'")
            assert await reader.fetchval("SELECT count(*) FROM events WHERE id = $1", pending) == 1
            await subs.rollback()
    finally:
        await holder.close()
        await reader.close()
    await pg_bus.prune(retention=DROP)  # whether the pass above got through or timed out
    assert not await _exists(sql, old)
    assert await sql.fetchval("SELECT tableoid::regclass::text FROM events WHERE id = $1", pending) == (
        "events_kept"
    )
    await drain(pg_bus)
    assert [d.status for d in (await pg_bus.trace(pending)).deliveries] == ["completed"]


async def test_a_chunk_with_many_survivors_is_compacted_in_place(pg_bus, sql, monkeypatch) -> None:
    """More survivors than a drop re-inserts under the log's lock: the chunk's table is swapped
    for a copy of them (made before the lock) when that frees at least half of it, and the
    chunk waits otherwise; a later pass drops it once they are few."""
    monkeypatch.setattr(pg_retention, "_MOVE_LIMIT", 3)

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await pg_bus.register()
    pending = [
        r.event_id for r in await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(8)])
    ]
    await pg_bus.publish_many([Shipped(order_id=str(i)) for i in range(10)])  # no delivery: they go
    await pg_bus.prune(retention=ROTATE)
    await pg_bus.publish_many([OrderPlaced(order_id=f"b{i}") for i in range(4)])
    await pg_bus.publish(Shipped(order_id="b"))  # 4 of 5 stay: compacting frees too little
    await pg_bus.prune(retention=ROTATE)
    (a, a_lo, a_hi, _), (b, *_), *_ = await _chunks(sql)
    prune = functools.partial(
        pg_bus.backend.retention.prune_chunks, completed_seconds=0.0, dead_seconds=None,
        dedup_seconds=0.0, chunk_seconds=86400.0, chunk_ids=100, max_survivors=100,
    )  # fmt: skip
    done = await prune()
    assert (done.events, done.pinned, done.compacted) == (10, 1, 1)
    assert (
        await sql.fetchval(f"SELECT count(*) FROM {a}") == 8
        and await sql.fetchval(f"SELECT count(*) FROM {b}") == 5
    )
    # Half of them lose their deliveries: the compacted chunk is compacted again.
    await sql.execute("DELETE FROM deliveries WHERE event_id = ANY($1::bigint[])", pending[:4])
    pending = pending[4:]
    done = await prune()
    assert (done.events, done.pinned, done.compacted) == (4, 1, 1)
    # The copy is the chunk now: a partition of the log with its bounds and the log's indexes.
    assert (
        await sql.fetchval(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c WHERE c.oid = $1::regclass", a
        )
        == f"FOR VALUES FROM ('{a_lo}') TO ('{a_hi}')"
    )
    attached = await sql.fetchval(
        "SELECT count(*) FROM pg_index x JOIN pg_inherits i ON i.inhrelid = x.indexrelid"
        " WHERE x.indrelid = $1::regclass",
        a,
    )
    assert attached == await sql.fetchval("SELECT count(*) FROM pg_index WHERE indrelid = 'events'::regclass")
    assert [r["id"] for r in await sql.fetch(f"SELECT id FROM {a} ORDER BY id")] == pending
    await drain(pg_bus)
    assert {d.status for i in pending for d in (await pg_bus.trace(i)).deliveries} == {"completed"}
    await pg_bus.prune(retention=DROP)  # their deliveries go, then the chunk: none of it stays
    assert not await _exists(sql, a) and not await _exists(sql, b)
    assert await sql.fetchval("SELECT count(*) FROM events") == 0


async def test_a_compaction_refused_the_log_leaves_no_copy_behind(
    pg_bus, pg_target, sql, monkeypatch
) -> None:
    """A compaction copies the survivors before it asks for the log's lock; a pass that never
    gets the lock (a reader holds the log throughout) rolls the copy back with it, and the
    next pass compacts the chunk (a copy left behind made every later pass fail)."""
    monkeypatch.setattr(pg_retention, "_MOVE_LIMIT", 1)

    @pg_bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await pg_bus.register()
    await pg_bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(2)])
    await pg_bus.publish_many([Shipped(order_id=str(i)) for i in range(4)])
    await pg_bus.prune(retention=ROTATE)
    a = (await _chunks(sql))[0][0]
    prune = functools.partial(
        pg_bus.backend.retention.prune_chunks, completed_seconds=0.0, dead_seconds=None,
        dedup_seconds=0.0, chunk_seconds=86400.0, chunk_ids=100, max_survivors=100,
    )  # fmt: skip
    reader = await asyncpg.connect(pg_target.dsn)
    try:
        async with reader.transaction():
            await reader.execute(f'LOCK TABLE ONLY "{pg_target.schema}".events IN ACCESS SHARE MODE')
            refused = await prune()
    finally:
        await reader.close()
    assert (refused.busy, refused.compacted) == (1, 0)
    assert not await _exists(sql, f"{a}_next") and await sql.fetchval(f"SELECT count(*) FROM {a}") == 6
    done = await prune()
    assert (done.events, done.compacted) == (4, 1)
    assert await sql.fetchval(f"SELECT count(*) FROM {a}") == 2


async def test_a_walk_batch_of_kept_events_reads_the_ring_once(pg_target) -> None:
    """Events that outlived their chunk (events_kept) while deliveries of theirs were in the
    append-only ring: a retention batch over them reads the ring once, not once per event
    (ring_ready has no index on event_id: a read per event of a full ring took minutes)."""
    q, conn, s = await migrated(pg_target)
    try:
        sub = await subscription(conn, s)
        base = 1 << 50  # past every chunk: the events land in events_kept
        await conn.execute(
            f"INSERT INTO {s}.events (id, event_type, payload, created_at) OVERRIDING SYSTEM VALUE "
            "SELECT $1::bigint + g, 'order.placed', '{}'::bytea, now() - interval '1 hour' "
            "FROM generate_series(1, 200) g",
            base,
        )
        # The first 100 have an unclaimed delivery in the ring, among other ring rows.
        await conn.execute(
            f"INSERT INTO {s}.ring_ready (slot, delivery_id, subscription_id, event_id) "
            "SELECT 0, g, $2, CASE WHEN g <= 100 THEN $1::bigint + g ELSE g END "
            "FROM generate_series(1, 5000) g",
            base,
            sub,
        )
        await conn.execute(f"ANALYZE {s}.events_kept, {s}.ring_ready")
        tx = conn.transaction()
        await tx.start()
        args: tuple[object, ...] = (base, 1000, 0.0, None, 0.0, False, [], [], [], 0.0, True)
        plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {q['prune_batch']}", *args))[0]
        await tx.rollback()
        assert [n["Actual Loops"] for n in scans(plan, "ring_ready_0")] == [1], plan
        row = await conn.fetchrow(q["prune_batch"], *args)
        assert row is not None and row["events"] == 100  # those with a delivery in the ring stay
        left = await conn.fetch(f"SELECT id FROM {s}.events_kept ORDER BY id")
        assert [r["id"] for r in left] == [base + g for g in range(1, 101)]
    finally:
        await conn.close()


async def test_the_claim_and_a_lookup_by_id_read_one_chunk(pg_target) -> None:
    q, conn, s = await migrated(pg_target)
    try:
        sub = await subscription(conn, s)
        for _ in range(3):  # three chunks of 1,000 events, each closed
            await conn.execute(
                f"INSERT INTO {s}.events (event_type, payload) "
                "SELECT 'order.placed', '{}'::bytea FROM generate_series(1, 1000)"
            )
            await conn.fetchval(f"SELECT {s}.rotate_event_chunks(100000, 0, 0.9)")
        ids = [r[0] for r in await conn.fetch(f"SELECT id FROM {s}.events ORDER BY id")]
        assert len(await conn.fetch(f"SELECT 1 FROM {s}.event_chunks")) >= 4
        middle = ids[1500]
        await conn.execute(
            f"INSERT INTO {s}.deliveries (event_id, subscription_id) SELECT unnest($1::bigint[]), $2",
            ids[1400:1450],
            sub,
        )
        await conn.execute(f"ANALYZE {s}.events, {s}.deliveries")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        token = "00000000-0000-4000-8000-000000000000"
        tx = conn.transaction()
        await tx.start()
        for _ in range(6):  # a generic plan, as a pooled connection settles on; 5 of the 50 each time
            claim = json.loads(
                await conn.fetchval(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {q['claim']}", sub, 5, 30.0, token, token, 0.0
                )
            )[0]
        await tx.rollback()
        assert claim["Plan"]["Actual Rows"] == 5
        lookup = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {q['event_row']}", middle))[
            0
        ]
        for plan in (claim, lookup):
            assert len(partitions_read(plan, "events")) == 1, plan
    finally:
        await conn.close()


SEED_0022 = """
INSERT INTO {s}.subscriptions (name, event_type, max_attempts, lease_seconds)
VALUES ('h', 'test.order_placed', 1, 30);
INSERT INTO {s}.events (event_type, key, payload)
SELECT 'test.order_placed', CASE WHEN g % 10 = 0 THEN 'k' || g END,
       convert_to('{{"order_id":"' || g || '"}}', 'UTF8')
FROM generate_series(1, 1000) g;
INSERT INTO {s}.deliveries (event_id, subscription_id, status)
SELECT id, (SELECT id FROM {s}.subscriptions),
       CASE WHEN id <= 500 THEN 'pending' WHEN id <= 503 THEN 'dead' ELSE 'completed' END
FROM {s}.events;
"""


async def test_a_log_migrated_from_0022_becomes_the_first_chunk(pg_target, sql) -> None:
    """Events, pending deliveries and dead letters written before the log had chunks carry on."""
    from eventbus.backends._migrations import discover

    s = f'"{pg_target.schema}"'
    bus = pg_target.bus()
    try:
        q = bus.backend.db.q
        await sql.execute(f"CREATE SCHEMA {s}")
        await sql.execute(q["migrations_table"])
        for m in [m for m in discover("postgres") if m.version <= 22]:
            async with sql.transaction():
                await sql.execute(m.sql.replace("{schema}", s))
                await sql.execute(q["migration_record"], m.version, m.name, m.checksum)
        await sql.execute(SEED_0022.format(s=s))
        assert await bus.migrate() == [m.name for m in discover("postgres") if m.version > 22]
        assert await sql.fetchval("SELECT count(*) FROM events_0") == 1000
        assert await sql.fetchval("SELECT count(*) FROM event_keys") == 100
        dup = await bus.publish(OrderPlaced(order_id="10"), key="k10")
        assert dup.duplicate and dup.event_id == 10
        fresh = await bus.publish(OrderPlaced(order_id="new"), key="new")
        assert not fresh.duplicate and fresh.event_id > 1000

        refuse = [True]

        @bus.subscribe(OrderPlaced, name="h", retry=RetryPolicy(max_attempts=1))
        async def h(event: OrderPlaced, ctx: Context) -> None:
            if refuse[0] and event.order_id == "new":
                raise DeadLetter("refused")

        await drain(bus)  # the 500 pending ones and the new event
        refuse[0] = False
        assert await bus.replay(DeliveryFilter(status="dead")) == 4  # three old, one new
        await drain(bus)
        report = await bus.prune(retention=DROP)
        assert report.events == 1001 and not await _exists(sql, f"{s}.events_0")  # with the new one
        assert await sql.fetchval("SELECT count(*) FROM deliveries WHERE status <> 'completed'") == 0
        again = await bus.publish(OrderPlaced(order_id="10"), key="k10")
        assert not again.duplicate and again.event_id > fresh.event_id
    finally:
        await bus.aclose()
