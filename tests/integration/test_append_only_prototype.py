"""The append-only hot-path prototype (benchmarks/append_only.py) keeps its promises on PostgreSQL.

A tiny run with everything that can race: two subscriptions, failures (a new
run per failure), leases left to expire while slots rotate and are pruned
under the claims (the rescue writes ``lease_expired`` under the claim's key;
the late completion that follows must lose), carry-forward of unclaimed rows.
The checks are the prototype's own, read from what the clients were told and
from the outcome log.
"""

from __future__ import annotations

import datetime as dt
import uuid

import anyio
import asyncpg

from benchmarks.append_only import Config, Leader, Ledger, Ring, check, run_prototype


def _race(**changes: object) -> Config:
    base = Config(
        events=1_000,
        subscriptions=2,
        workers=4,
        batch=20,
        slots=6,
        rotate_seconds=0.2,
        close_lag=1,
        tick_seconds=0.05,
        lease_seconds=0.4,
        fail=0.1,
        expire=0.02,
        max_attempts=2,
        bucket_seconds=2.0,
        keep_buckets=30,
        steady=True,
        publish_rate=2_000.0,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


async def test_every_delivery_settles_once_through_prunes_and_rescues(pg_dsn: str) -> None:
    out = await run_prototype(pg_dsn, _race(), measure=False)

    checked = out["check"]
    assert checked["deliveries"] == 2_000
    assert checked["lost"] == 0
    assert checked["more_than_one_terminal"] == 0
    assert checked["runs_claimed_twice"] == 0
    assert checked["runs_settled_twice"] == 0
    assert checked["run_sequence_broken"] == 0
    assert checked["log_rows_disagreeing"] == 0  # the log, read before retention, says what the clients saw
    assert checked["open_work_at_end"] == {"unclaimed": 0, "unsettled": 0}
    # Leases did expire, the rescue settled them, and every late completion after it lost.
    assert checked["outcomes"].get("lease_expired", 0) + checked["outcomes"].get("dead", 0) > 0
    assert checked["stale_completions"] > 0
    assert checked["stale_completions_won"] == 0
    assert checked["outcomes"]["failed"] > 0
    assert checked["ok"]
    # Slots were rotated and pruned while the workers claimed.
    assert out["leader"]["prunes"] >= 3
    assert out["leader"]["rescued"] > 0


async def test_a_late_completion_loses_to_the_rescue_and_a_claim_is_taken_once(pg_dsn: str) -> None:
    """The two fences directly: the claim ledger's key and the log's key."""
    ring = Ring(f"ring_test_{uuid.uuid4().hex[:8]}", Config(slots=2, max_attempts=3))
    conn = await asyncpg.connect(pg_dsn)
    try:
        await ring.create(conn)
        await ring.premake(conn)
        (row,) = await conn.fetch(ring.publish, [b"{}"], [1])
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)  # the claim's cursor: before every row
        claimed = await conn.fetch(ring.claim(), [0], 1, epoch, 0, 10, 7, -1.0, 1)  # lease already over
        assert [r["delivery_id"] for r in claimed] == [row["delivery_id"]]
        # A second claim finds nothing: the claim row fences the run.
        assert await conn.fetch(ring.claim(), [0], 1, epoch, 0, 10, 8, 30.0, 2) == []

        rescued = await conn.fetch(ring.rescue, [0], epoch, 3)
        assert [(r["run"], r["status"]) for r in rescued] == [(1, "lease_expired")]
        (c,) = claimed
        late = await conn.fetch(
            ring.settle,
            [c["part"]],
            [c["delivery_id"]],
            [c["run"]],
            [c["subscription_id"]],
            [c["event_part"]],
            [c["event_id"]],
            [c["attempt"]],
            ["completed"],
            3,
            1,
            0.0,
        )
        assert late == []  # the rescue took the run's key first
        # The rescue made run 2, which a claim takes and completes.
        (again,) = await conn.fetch(ring.claim(), [0], 1, epoch, 0, 10, 9, 30.0, 1)
        assert again["run"] == 2
        done = await conn.fetch(
            ring.settle,
            [again["part"]],
            [again["delivery_id"]],
            [again["run"]],
            [again["subscription_id"]],
            [again["event_part"]],
            [again["event_id"]],
            [again["attempt"]],
            ["completed"],
            3,
            1,
            0.0,
        )
        assert [r["status"] for r in done] == ["completed"]

        ledger = Ledger(expected=1)
        ledger.published.add(int(row["delivery_id"]))
        for run in (1, 2):
            ledger.claimed[(int(row["delivery_id"]), run)] += 1
        ledger.won(rescued, rescue=True)
        ledger.won(done)
        assert check(ledger)["ok"]
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {ring.s} CASCADE")
        await conn.close()


async def test_a_prune_waits_for_open_leases_then_carries_unclaimed_rows_forward(pg_dsn: str) -> None:
    ring = Ring(f"ring_test_{uuid.uuid4().hex[:8]}", Config(slots=3, max_attempts=3))
    conn = await asyncpg.connect(pg_dsn)
    try:
        await ring.create(conn)
        await ring.premake(conn)
        published = sorted(r["delivery_id"] for r in await conn.fetch(ring.publish, [b"{}"] * 5, [1]))
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        (held,) = await conn.fetch(ring.claim(), [0], 1, epoch, 0, 1, 7, 30.0, 1)  # a valid lease in slot 0
        assert held["delivery_id"] == published[0]
        leader = Leader(ring, conn, Ledger())
        await leader.rotate(close_all=True)  # slot 1 is current, slot 0 closed
        assert await leader.prune_slot(0, 0) == "lease_open"
        assert await conn.fetchval(f"SELECT count(*) FROM {ring.s}.ready_0") == 5

        settled = await conn.fetch(
            ring.settle,
            *[[held[c]] for c in ("part", "delivery_id", "run", "subscription_id", "event_part", "event_id")],
            [held["attempt"]],
            ["completed"],
            3,
            1,
            0.0,
        )
        assert len(settled) == 1
        assert await leader.prune_slot(0, 0) == "pruned"
        assert leader.stats.carried_forward == 4
        assert await conn.fetchval(f"SELECT count(*) FROM {ring.s}.ready_0") == 0
        # The four unclaimed rows live on in slot 1 under their ids and first run, and are claimable.
        moved = await conn.fetch(ring.claim(), [1], 1, epoch, 0, 10, 8, 30.0, 1)
        assert sorted((r["delivery_id"], r["run"]) for r in moved) == [(d, 1) for d in published[1:]]
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {ring.s} CASCADE")
        await conn.close()


async def test_a_log_bucket_stays_while_claims_made_in_it_are_in_the_ring(pg_dsn: str) -> None:
    """Dropping a settled claim's log bucket before its slot is pruned would make it look open again."""
    ring = Ring(f"ring_test_{uuid.uuid4().hex[:8]}", Config(slots=3, bucket_seconds=1.0, keep_buckets=0))
    conn = await asyncpg.connect(pg_dsn)
    try:
        await ring.create(conn)
        await ring.premake(conn, ahead=20)
        await conn.fetch(ring.publish, [b"{}"], [1])
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        (c,) = await conn.fetch(ring.claim(), [0], 1, epoch, 0, 1, 7, 0.1, 1)  # a lease of 0.1 s
        settled = await conn.fetch(
            ring.settle,
            *[[c[k]] for k in ("part", "delivery_id", "run", "subscription_id", "event_part", "event_id")],
            [c["attempt"]],
            ["completed"],
            3,
            1,
            0.0,
        )
        assert len(settled) == 1
        await anyio.sleep(1.1)  # the claim's bucket is now behind the kept ones
        leader = Leader(ring, conn, Ledger())
        await leader.drop_buckets()
        assert c["part"] in await ring.buckets(conn, "log")
        await leader.rescue()  # the lease is over, the run settled: nothing to rescue
        assert leader.stats.rescued == 0
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {ring.s} CASCADE")
        await conn.close()
