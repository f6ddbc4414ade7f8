"""PostgreSQL's append-only hot path (``Bus(dsn, append_only=True)``, eventbus/backends/postgres/ring.py).

The delivery contract itself runs on this path through the contract suite
(the ``postgres-append-only`` target); these tests check what only this path
has: what it writes, how its slots rotate and empty, how a delivery leaves
the ring, its fences, and the retention of its outcome log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import asyncpg
import pytest

from eventbus import BackendError, Bus, ConfigurationError, Context, Retention
from eventbus.backends.postgres import PostgresBackend, ring

from ..conftest import Target
from ..support.helpers import FAST, OrderPlaced, counts, drain
from ..support.plans import is_part_of, rows_compared, rows_read
from ..support.templates import seed_postgres

WORKER = "00000000-0000-4000-8000-0000000000aa"

# The bus's tables a delivery's life writes: each must see inserts only.
DELIVERY_TABLES = (
    "events", "event_keys", "deliveries", "delivery_attempts", "ring_ready", "ring_claims", "delivery_log",
)  # fmt: skip


@pytest.fixture
async def ring_bus(pg_target: Target) -> AsyncIterator[Bus]:
    await seed_postgres(pg_target.dsn, pg_target.schema or "")
    bus = pg_target.bus(append_only=True)
    await bus.migrate()
    yield bus
    await bus.aclose()


def _subscribe(bus: Bus, seen: list[str] | None = None) -> None:
    @bus.subscribe(OrderPlaced, name="h", retry=FAST)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        if seen is not None:
            seen.append(event.order_id)


async def _sql(target: Target, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(target.dsn)
    try:
        return list(await conn.fetch(query.replace("{schema}", target.schema or ""), *args))
    finally:
        await conn.close()


async def _writes(target: Target) -> dict[str, tuple[int, int]]:
    """(inserts, updates + deletes) per table, partitions summed into their table."""
    rows = await _sql(
        target,
        """SELECT r.relname AS t, sum(s.n_tup_ins)::bigint AS ins,
                  sum(s.n_tup_upd + s.n_tup_del)::bigint AS changed
           FROM pg_stat_user_tables s
           JOIN pg_class r ON r.oid = coalesce(pg_partition_root(s.relid), s.relid)
           WHERE s.schemaname = $1 GROUP BY r.relname""",
        target.schema,
    )
    return {r["t"]: (r["ins"], r["changed"]) for r in rows}


async def test_sqlite_refuses_the_option(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="append_only"):
        Bus(f"sqlite:///{tmp_path / 'bus.db'}", append_only=True)


async def test_an_ordinary_delivery_is_inserts_only(
    pg_target: Target, ring_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One slot for the whole test: a slot emptied while a completion is on its way moves that
    # claim into deliveries (correct, and counted there), which a slow machine could make happen.
    monkeypatch.setattr(ring, "SLOT_SECONDS", 3600.0)
    seen: list[str] = []
    _subscribe(ring_bus, seen)
    await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(300)])
    await drain(ring_bus, concurrency=50, batch_size=50)
    assert sorted(seen) == sorted(f"o-{i}" for i in range(300))
    assert await counts(ring_bus) == {("h", "completed"): 300}
    await ring_bus.aclose()  # its sessions end: their table statistics reach the server
    with anyio.fail_after(10):
        while (await _writes(pg_target)).get("delivery_log", (0, 0))[0] < 300:
            await anyio.sleep(0.1)
    writes = await _writes(pg_target)
    assert {t: writes[t][1] for t in DELIVERY_TABLES} == dict.fromkeys(DELIVERY_TABLES, 0)
    assert writes["ring_ready"][0] == writes["ring_claims"][0] == 300
    assert writes["deliveries"][0] == 0  # nothing left the ring


async def test_slots_rotate_and_empty_by_truncate(
    pg_target: Target, ring_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ring, "SLOT_ROWS", 40)
    monkeypatch.setattr(ring, "SETTLE_SECONDS", 0.0)
    _subscribe(ring_bus)
    await ring_bus.register()
    store = ring_bus.backend.deliveries
    for round_ in range(6):
        await ring_bus.publish_many([OrderPlaced(order_id=f"o-{round_}-{i}") for i in range(50)])
        await store.upkeep()  # seals the full slot
        await drain(ring_bus, concurrency=20, batch_size=20)
        for _ in range(3):  # closes the drained slot, then prunes it
            await store.upkeep()
    stats = store.ring.stats  # type: ignore[attr-defined]
    assert stats.rotations >= 5 and stats.pruned >= 4 and stats.spilled == 0
    kinds = await _sql(pg_target, "SELECT kind, count(*) AS n FROM {schema}.ring_log GROUP BY kind")
    assert {r["kind"]: r["n"] for r in kinds}["pruned"] == stats.pruned
    left = await _sql(pg_target, "SELECT count(*) AS n FROM {schema}.ring_ready")
    assert left[0]["n"] <= 50  # the slots pruned are empty: what is left is the open slot's
    assert await counts(ring_bus) == {("h", "completed"): 300}


async def test_a_backlog_older_than_the_ring_leaves_it_and_runs_from_the_queue(
    pg_target: Target, ring_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ring, "SLOT_SECONDS", 0.0)
    monkeypatch.setattr(ring, "MAX_AGE_SECONDS", 0.0)
    monkeypatch.setattr(ring, "SETTLE_SECONDS", 0.0)
    seen: list[str] = []
    _subscribe(ring_bus, seen)
    await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(120)])
    store = ring_bus.backend.deliveries
    for _ in range(3):  # seal the slot, close it (too old), prune it
        await store.upkeep()
    assert store.ring.stats.spilled == 120  # type: ignore[attr-defined]
    queued = await _sql(pg_target, "SELECT status, count(*) AS n FROM {schema}.deliveries GROUP BY 1")
    assert [(r["status"], r["n"]) for r in queued] == [("pending", 120)]
    assert await counts(ring_bus) == {("h", "pending"): 120}
    await drain(ring_bus)
    assert sorted(seen) == sorted(f"o-{i}" for i in range(120))  # each once


async def test_a_claim_that_left_the_ring_is_still_completed_by_its_holder(
    pg_target: Target, ring_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ring, "SLOT_SECONDS", 0.0)
    monkeypatch.setattr(ring, "MAX_AGE_SECONDS", 0.0)
    monkeypatch.setattr(ring, "SETTLE_SECONDS", 0.0)
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(3)])
    store = ring_bus.backend.deliveries
    batch = await store.claim(ids["h"], 3, 60.0, WORKER)
    assert len(batch) == 3
    for _ in range(3):  # its slot is pruned under the live leases: the claims move
        await store.upkeep()
    rows = await _sql(pg_target, "SELECT status, lease_token::text AS t FROM {schema}.deliveries")
    assert [(r["status"], r["t"]) for r in rows] == [("processing", batch[0].lease_token)] * 3
    from eventbus.backends.ports import Completion

    done = await store.complete([Completion(d.id, d.lease_token) for d in batch])
    assert done == {(d.id, d.lease_token) for d in batch}
    assert await counts(ring_bus) == {("h", "completed"): 3}


async def test_a_late_completion_after_the_lease_was_taken_back_is_refused(ring_bus: Bus) -> None:
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish(OrderPlaced(order_id="o-1"))
    store = ring_bus.backend.deliveries
    (stale,) = await store.claim(ids["h"], 1, 0.05, WORKER)
    await anyio.sleep(0.2)
    assert await store.recover_expired() == 1  # moved off the ring, then back to pending
    (fresh,) = await store.claim(ids["h"], 1, 60.0, WORKER)
    assert fresh.id == stale.id and fresh.attempts == 2
    from eventbus.backends.ports import Completion

    assert await store.complete([Completion(stale.id, stale.lease_token)]) == set()
    assert await store.complete([Completion(fresh.id, fresh.lease_token)]) == {(fresh.id, fresh.lease_token)}
    assert await counts(ring_bus) == {("h", "completed"): 1}


async def test_a_completion_after_a_refused_batch_follows_a_claim_moved_while_it_looks(
    pg_target: Target, ring_bus: Bus
) -> None:
    """A batch the database refused rolled back, and its ring claims are completed again, one
    by one: each is looked for in ``deliveries``, then in the ring. A claim moved out of the
    ring between the two (a prune, an operator's action) is completed where it went, not
    refused as stale while its holder still holds its lease."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish(OrderPlaced(order_id="o-1"))
    backend, store = ring_bus.backend, ring_bus.backend.deliveries
    assert isinstance(backend, PostgresBackend)
    (held,) = await store.claim(ids["h"], 1, 60.0, WORKER)
    from eventbus.backends.ports import Completion, OutgoingEvent

    unstorable = OutgoingEvent("test.order_placed", b"{}", key=uuid.uuid4())  # type: ignore[arg-type]
    with pytest.raises(BackendError):
        await store.complete([Completion(held.id, held.lease_token, follow_ups=[unstorable])])
    mover = await asyncpg.connect(pg_target.dsn)
    try:
        move = mover.transaction()
        await move.start()
        await ring.to_queue(mover, backend.db, [held.id])  # as an operator's action by id does

        async def commit_once_the_completion_waits() -> None:  # on the move's outcome row
            waiting = "SELECT count(*) AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
            while not (await _sql(pg_target, waiting, mover.get_server_pid()))[0]["n"]:
                await anyio.sleep(0.01)
            await move.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit_once_the_completion_waits)
            with anyio.fail_after(10):
                done = await store.complete([Completion(held.id, held.lease_token)])
    finally:
        await mover.close()
    assert done == {(held.id, held.lease_token)}
    assert await counts(ring_bus) == {("h", "completed"): 1}


async def test_concurrent_claimers_never_share_a_delivery(pg_target: Target, ring_bus: Bus) -> None:
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    total = 1500
    for start in range(0, total, 500):
        await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(start, start + 500)])
    buses = [pg_target.bus(append_only=True) for _ in range(4)]
    claimed: list[int] = []

    async def claimer(bus: Bus) -> None:
        store = bus.backend.deliveries
        after = None
        while True:
            batch = await store.claim(ids["h"], 7, 60.0, WORKER, after=after)
            if not batch:
                batch = await store.claim(ids["h"], 7, 60.0, WORKER)  # behind the cursor
                if not batch:
                    return
            claimed.extend(d.id for d in batch)
            after = batch[-1].position

    try:
        async with anyio.create_task_group() as tg:
            for bus in buses:
                tg.start_soon(claimer, bus)
    finally:
        for bus in buses:
            await bus.aclose()
    assert len(claimed) == len(set(claimed)) == total


async def test_a_claim_never_touches_a_slot_outside_its_window(pg_target: Target, ring_bus: Bus) -> None:
    """Each statement is planned for its slots (plan_cache_mode = force_custom_plan): a prune's
    ACCESS EXCLUSIVE lock on a closed slot never holds a claim up, however often the claim ran."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    store = ring_bus.backend.deliveries
    for i in range(8):  # past PostgreSQL's five custom plans before it weighs a generic one
        await ring_bus.publish(OrderPlaced(order_id=f"o-{i}"))
        assert len(await store.claim(ids["h"], 1, 60.0, WORKER)) == 1
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        async with conn.transaction():
            await conn.execute(f"SELECT {pg_target.schema}.ring_lock_slot(9::smallint)")  # not in the window
            await ring_bus.publish(OrderPlaced(order_id="o-8"))
            with anyio.fail_after(5):
                assert len(await store.claim(ids["h"], 1, 60.0, WORKER)) == 1
    finally:
        await conn.close()


async def test_a_row_put_in_a_pruned_slot_leaves_the_ring(pg_target: Target, ring_bus: Bus) -> None:
    """A publish that read the ring's state before its slot closed and inserted after the slot
    was emptied: the upkeep finds the row in a free slot and spills it."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    event = await ring_bus.publish(OrderPlaced(order_id="late"), key="late")
    await _sql(
        pg_target,
        "INSERT INTO {schema}.ring_ready (slot, delivery_id, subscription_id, event_id) "
        "SELECT 7, nextval('{schema}.deliveries_id_seq'), $1, $2",
        ids["h"],
        event.event_id,
    )
    await _sql(pg_target, "DELETE FROM {schema}.ring_ready WHERE slot = 0")  # the publish's own row
    await ring_bus.backend.deliveries.upkeep()
    rows = await _sql(pg_target, "SELECT status FROM {schema}.deliveries WHERE event_id = $1", event.event_id)
    assert [r["status"] for r in rows] == ["pending"]
    assert (await _sql(pg_target, "SELECT count(*) AS n FROM {schema}.ring_ready_7"))[0]["n"] == 0


async def test_days_of_the_outcome_log_go_by_drop(pg_target: Target, ring_bus: Bus) -> None:
    _subscribe(ring_bus)
    await ring_bus.register()
    await _sql(pg_target, "SELECT {schema}.delivery_log_make(date '2020-01-01')")
    await ring_bus.publish(OrderPlaced(order_id="o-1"))
    await drain(ring_bus)
    report = await ring_bus.prune(retention=Retention(completed_retention=timedelta(days=1)))
    assert report is not None
    parts = await _sql(
        pg_target,
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = '{schema}.delivery_log'::regclass ORDER BY 1",
    )
    names = [r["relname"] for r in parts]
    assert "delivery_log_20200101" not in names and len(names) >= 3  # today and the days ahead stay
    assert await counts(ring_bus) == {("h", "completed"): 1}  # today's outcome is kept


async def test_turning_it_on_keeps_the_work_already_queued(pg_target: Target) -> None:
    await seed_postgres(pg_target.dsn, pg_target.schema or "")
    seen: list[str] = []
    before = pg_target.bus()
    _subscribe(before, seen)
    await before.register()
    await before.publish_many([OrderPlaced(order_id=f"old-{i}") for i in range(20)])
    await before.aclose()
    after = pg_target.bus(append_only=True)
    _subscribe(after, seen)
    try:
        await after.register()
        await after.publish_many([OrderPlaced(order_id=f"new-{i}") for i in range(20)])
        assert await counts(after) == {("h", "pending"): 40}
        await drain(after)
        assert sorted(seen) == sorted([f"old-{i}" for i in range(20)] + [f"new-{i}" for i in range(20)])
        assert seen[:20] == [f"old-{i}" for i in range(20)]  # the older work first
    finally:
        await after.aclose()


async def test_a_lost_workers_ring_claims_are_rescued(ring_bus: Bus) -> None:
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(2)])
    store = ring_bus.backend.deliveries
    lost = str(uuid.uuid4())
    await store.worker_beat(lost)
    batch = await store.claim(ids["h"], 2, 600.0, lost)
    assert len(batch) == 2
    rescues = await store.rescue(silent_seconds=0.0)
    assert [r.deliveries for r in rescues if r.worker_id == lost] == [2]
    assert await counts(ring_bus) == {("h", "pending"): 2}


async def test_a_live_claim_an_operator_moved_out_of_the_ring_is_renewed_and_completed(ring_bus: Bus) -> None:
    """A stuck-cancel leaves a live lease of a live worker alone, but moves it into deliveries:
    the holder's renewal (young or not) and its completion follow it there."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish(OrderPlaced(order_id="o-1"))
    store = ring_bus.backend.deliveries
    await store.worker_beat(WORKER)
    (held,) = await store.claim(ids["h"], 1, 60.0, WORKER)
    assert await ring_bus.cancel([held.id], stuck=True) == 0  # its worker is alive: left alone
    assert await store.extend([held.id], held.lease_token, 60.0) == {held.id}
    from eventbus.backends.ports import Completion

    assert await store.complete([Completion(held.id, held.lease_token)]) == {(held.id, held.lease_token)}
    assert await counts(ring_bus) == {("h", "completed"): 1}


async def test_rows_published_into_a_slot_opened_long_ago_stay_in_the_ring(
    pg_target: Target, ring_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot's time to close counts from when it was sealed, not from when it opened: an idle
    bus's first publishes are not sent off the ring at the next rotation."""
    monkeypatch.setattr(ring, "MAX_AGE_SECONDS", 5.0)
    monkeypatch.setattr(ring, "SETTLE_SECONDS", 0.0)
    _subscribe(ring_bus)
    await ring_bus.register()
    await _sql(pg_target, "UPDATE {schema}.ring_log SET at = now() - interval '1 hour'")  # idle an hour
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(10)])
    store = ring_bus.backend.deliveries
    for _ in range(3):  # seals the old slot at once (2 s old with rows); it must not close yet
        await store.upkeep()
    stats = store.ring.stats  # type: ignore[attr-defined]
    assert (stats.rotations, stats.closed, stats.spilled) == (1, 0, 0)
    await drain(ring_bus)
    assert store.ring.stats.spilled == 0  # type: ignore[attr-defined]  # claimed from the ring
    assert await counts(ring_bus) == {("h", "completed"): 10}


async def test_retention_right_after_a_drain_keeps_no_event_of_a_completed_ring_delivery(
    pg_target: Target, ring_bus: Bus
) -> None:
    """A completed ring delivery is history: its event goes with its chunk even while the
    drained slot still holds the delivery's rows."""
    _subscribe(ring_bus)
    await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(50)])
    await drain(ring_bus)
    await ring_bus.prune(retention=Retention(completed_retention=timedelta(0), dedup_window=timedelta(0)))
    await ring_bus.prune(retention=Retention(completed_retention=timedelta(0), dedup_window=timedelta(0)))
    kept = await _sql(pg_target, "SELECT count(*) AS n FROM {schema}.events_kept")
    assert kept[0]["n"] == 0
    assert (await _sql(pg_target, "SELECT count(*) AS n FROM {schema}.events"))[0]["n"] == 0


async def test_a_retention_pass_waits_out_a_slot_being_emptied(pg_target: Target, ring_bus: Bus) -> None:
    """The retention walk reads the ring (the events of its unsettled rows stay) while the
    upkeep empties a slot under an ACCESS EXCLUSIVE lock: the walk's batch, whose lock wait is
    bounded, tries again instead of failing the pass."""
    _subscribe(ring_bus)
    await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(5)])
    await drain(ring_bus)
    conn = await asyncpg.connect(pg_target.dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f"SELECT {pg_target.schema}.ring_lock_slot(3::smallint)")

        async def let_go() -> None:
            await anyio.sleep(0.8)  # past the batch's lock_timeout of 200 ms, as a slow prune would be
            await tx.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(let_go)
            with anyio.fail_after(10):
                report = await ring_bus.prune(
                    retention=Retention(completed_retention=timedelta(0), dedup_window=timedelta(0))
                )
    finally:
        await conn.close()
    assert report is not None
    assert (await _sql(pg_target, "SELECT count(*) AS n FROM {schema}.events"))[0]["n"] == 0


async def test_a_claim_that_comes_up_short_looks_at_the_newest_slots(
    pg_target: Target, ring_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window of slots a process claims from is cached for a moment; a claim that comes up
    short reads it again before it says there is nothing, so a burst worker never ends with
    rows waiting in a slot opened since it last looked."""
    monkeypatch.setattr(ring, "WINDOW_SECONDS", 3600.0)  # a window cached for the whole test
    monkeypatch.setattr(ring, "SLOT_ROWS", 5)
    seen: list[str] = []
    _subscribe(ring_bus, seen)
    await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"a-{i}") for i in range(5)])
    await drain(ring_bus)  # caches the window: the first slot
    await ring_bus.backend.deliveries.upkeep()  # the full slot is sealed: the next one opens
    await ring_bus.publish_many([OrderPlaced(order_id=f"b-{i}") for i in range(5)])
    await drain(ring_bus)
    assert sorted(seen) == sorted([f"a-{i}" for i in range(5)] + [f"b-{i}" for i in range(5)])


async def test_a_claim_probes_the_claims_by_key_whatever_their_statistics(
    pg_target: Target, ring_bus: Bus
) -> None:
    """An ANALYZE of a slot that ran while every claim row it sampled was uncommitted (a rotation
    sealing a slot as its first claims were made) records pages and no rows. Planned on that
    estimate of one claim row, a claim compared each ready row it read with every claim row of
    the slot: 2.2 million comparisons for a claim of 100 at 2,000 claimed. It probes the claims
    by key instead, one probe per ready row read."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(3000)])
    backend = ring_bus.backend
    assert isinstance(backend, PostgresBackend)
    claim = backend.db.q["ring_claim"]
    s = pg_target.schema
    holder, other = await asyncpg.connect(pg_target.dsn), await asyncpg.connect(pg_target.dsn)
    try:
        async with holder.transaction():
            taken = await holder.fetch(claim, [0], ids["h"], 0, 2000, uuid.uuid4(), uuid.uuid4(), 60.0)
            await other.execute(f"SELECT {s}.ring_analyze_slot(0::smallint)")  # what a rotation runs
        assert len(taken) == 2000
        pages, tuples = await _ring_stats(other, f"{s}.ring_claims_0")
        assert pages > 0 and tuples == 0  # the statistics of an empty slot, with 2,000 claims in it
        args = ([0], ids["h"], 0, 100, uuid.uuid4(), uuid.uuid4(), 60.0)
        (plan,) = json.loads(await other.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + claim, *args))
    finally:
        await holder.close()
        await other.close()
    # About one row per ready row read (2,000 claimed, then 100 not) and the 100 claims inserted.
    assert rows_read(plan, "ring_claims") + rows_compared(plan) < 3000


def _looked_up(plan: dict, table: str) -> int:
    """Rows of ``table`` (or of its partitions) that a plan's subplans read, times their loops."""
    found, stack = 0, [(plan["Plan"], False)]
    while stack:
        node, inside = stack.pop()
        inside = inside or node.get("Parent Relationship") == "SubPlan"
        if inside and is_part_of(node.get("Relation Name"), table):
            found += node["Actual Loops"] * (node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
        stack.extend((child, inside) for child in node.get("Plans", []))
    return found


async def _ring_stats(conn: asyncpg.Connection, table: str) -> tuple[int, float]:
    row = await conn.fetchrow("SELECT relpages, reltuples FROM pg_class WHERE oid = $1::regclass", table)
    assert row is not None
    return row["relpages"], row["reltuples"]


async def test_moving_a_slots_open_claims_joins_them_by_key_whatever_their_statistics(
    pg_target: Target, ring_bus: Bus
) -> None:
    """A prune moves every open claim of its slot into deliveries, with the slot's statistics of
    its seal: an ANALYZE that saw only uncommitted claims estimates them at one row. Planned on
    that, the claims moved were joined with their outcome rows as a nested loop, each compared
    with all the others: 4 million comparisons for 2,000 open claims (14 s at 10,000). Each
    outcome row written finds its claim by key instead."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(2000)])
    backend = ring_bus.backend
    assert isinstance(backend, PostgresBackend)
    q, s, token = backend.db.q, pg_target.schema, uuid.uuid4()
    holder, other = await asyncpg.connect(pg_target.dsn), await asyncpg.connect(pg_target.dsn)
    try:
        async with holder.transaction():
            taken = await holder.fetch(q["ring_claim"], [0], ids["h"], 0, 2000, token, uuid.uuid4(), 60.0)
            await other.execute(f"SELECT {s}.ring_analyze_slot(0::smallint)")  # what a rotation runs
        assert len(taken) == 2000
        pages, tuples = await _ring_stats(other, f"{s}.ring_claims_0")
        assert pages > 0 and tuples == 0  # the statistics of an empty slot, with 2,000 claims in it
        args = ([0], None, None, None, False, 1_000_000)  # what a prune runs
        (plan,) = json.loads(await other.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + q["ring_move"], *args))
        moved = await other.fetchval(
            f"SELECT count(*) FROM {s}.deliveries WHERE status = 'processing' AND lease_token = $1", token
        )
    finally:
        await holder.close()
        await other.close()
    assert moved == 2000
    assert rows_compared(plan) < 2000


async def test_evicting_a_slots_ready_rows_joins_them_by_key_whatever_their_statistics(
    pg_target: Target, ring_bus: Bus
) -> None:
    """The mirror case: a slot sealed while the rows published into it were uncommitted (one
    large batch) is estimated at one ready row. Evicting its rows (a subscription made ordered
    or removed, an operator's action by id) joined the rows it fenced with their outcome rows
    as a nested loop over all of them: 4 million comparisons for 2,000 rows (13 s at 10,000).
    The rows go to deliveries from their outcome rows alone."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    backend = ring_bus.backend
    assert isinstance(backend, PostgresBackend)
    q, s = backend.db.q, pg_target.schema
    holder, other = await asyncpg.connect(pg_target.dsn), await asyncpg.connect(pg_target.dsn)
    try:
        async with holder.transaction():
            batch = [OrderPlaced(order_id=f"o-{i}") for i in range(2000)]
            await ring_bus.publish_many(batch, connection=holder)
            await other.execute(f"SELECT {s}.ring_analyze_slot(0::smallint)")  # what a rotation runs
        pages, tuples = await _ring_stats(other, f"{s}.ring_ready_0")
        assert pages > 0 and tuples == 0  # the statistics of an empty slot, with 2,000 rows in it
        args = ([0], ids["h"], None)  # what a subscription made ordered runs
        (plan,) = json.loads(await other.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + q["ring_evict"], *args))
        pending = await other.fetchval(f"SELECT count(*) FROM {s}.deliveries WHERE status = 'pending'")
    finally:
        await holder.close()
        await other.close()
    assert pending == 2000
    assert rows_compared(plan) < 2000


async def test_outcome_rows_are_looked_up_by_key_whatever_the_days_statistics(
    pg_target: Target, ring_bus: Bus
) -> None:
    """A day of the outcome log analyzed while the outcome rows it sampled were uncommitted (an
    autovacuum ANALYZE during a large completion) is estimated at one row however many it holds.
    Planned on that, the statements that ask whether a claim has an outcome compared each claim
    or ready row with every outcome row of the day: a renewal's check of 100 claims, 101 million
    comparisons (43 s) at a million outcomes; a retention pass over a chunk, 10 s; a status
    listing, or a read through the view delivery_rows (one event's deliveries, whether a schedule's
    firing is done), hashed the whole day for a few rows. Each looks its outcome row up by key."""
    _subscribe(ring_bus)
    ids = await ring_bus.register()
    await ring_bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(2100)])
    backend = ring_bus.backend
    assert isinstance(backend, PostgresBackend)
    q, s, done, held = backend.db.q, pg_target.schema, uuid.uuid4(), uuid.uuid4()
    holder, other = await asyncpg.connect(pg_target.dsn), await asyncpg.connect(pg_target.dsn)
    try:
        finished = await other.fetch(q["ring_claim"], [0], ids["h"], 0, 2000, done, uuid.uuid4(), 60.0)
        claimed = await other.fetch(q["ring_claim"], [0], ids["h"], 0, 100, held, uuid.uuid4(), 60.0)
        open_ = [r[0] for r in claimed]
        async with holder.transaction():
            completed = await holder.fetch(q["ring_complete"], [0], [r[0] for r in finished], done)
            await other.execute(f"ANALYZE {s}.delivery_log")  # what an autovacuum of the day runs
        assert len(completed) == 2000 and len(open_) == 100
        day = await other.fetchval("SELECT to_char(min(claimed_on), 'YYYYMMDD') FROM " + f"{s}.delivery_log")
        pages, tuples = await _ring_stats(other, f"{s}.delivery_log_{day}")
        assert pages > 0 and tuples == 0  # the statistics of an empty day, with 2,000 outcomes in it

        async def explain(name: str, *args: object) -> dict:
            (plan,) = json.loads(await other.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + q[name], *args))
            return plan

        chunk = await other.fetchrow(f"SELECT min(id), max(id) + 1 FROM {s}.events")
        assert chunk is not None
        none: list[str] = []  # no subscription with cutoffs of its own
        survivors = (chunk[0], chunk[1], None, 3600.0, False, None, None, none, none, none, 1000)
        assert len(await other.fetch(q["chunk_survivors"], *survivors)) == 100  # the open claims' events
        plans = {
            "ring_held": await explain("ring_held", [0], open_, held),  # a renewal's check
            "chunk_survivors": await explain("chunk_survivors", *survivors),  # a retention pass
            "status_recent": await explain("status_recent", 100),  # the newest deliveries
            "event_deliveries": await explain("event_deliveries", claimed[0][1]),  # through delivery_rows
        }
        assert {r[0] for r in await other.fetch(q["ring_held"], [0], open_, held)} == set(open_)
    finally:
        await holder.close()
        await other.close()
    # At most one probe of the outcome log per claim looked at (100 open; 2,100 claimed ready rows;
    # the 100 newest ring rows; the one delivery of an event).
    assert {n: rows_compared(p) for n, p in plans.items()} == dict.fromkeys(plans, 0)
    read = {n: _looked_up(p, "delivery_log") for n, p in plans.items()}
    assert read["ring_held"] <= 100 and read["chunk_survivors"] <= 2100 and read["status_recent"] <= 100, read
    assert read["event_deliveries"] <= 1, read
