"""Transactional handlers and states on PostgreSQL under faults: a lease taken over mid-run, SIGKILLs.

Kill soak: 1,200 ``txn.job`` events (EVENTBUS_SOAK_JOBS), each handled by a transactional handler
that inserts one row into the application's table ``app_rows`` (no unique
constraint) through ``ctx.connection``, waits 30 ms inside its transaction,
emits one follow-up without a key and starts a run of a state machine whose
transactional state inserts one row into ``wf_rows`` with its transition.
3 worker processes with a 2 s lease, one of them SIGKILLed 8 times (EVENTBUS_SOAK_KILLS) at random
moments and restarted. Afterwards: exactly one application row, one
follow-up and one completed run with one ``wf_rows`` row per job, every
delivery completed, and the kills left claimed deliveries behind (so
handlers did run again after a kill, and their first runs' writes are gone).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time

import anyio
import asyncpg

from eventbus import Context, Envelope, RetryPolicy, Worker

from ...apps.txn_events import TxnJob
from ...conftest import Target
from ...support.helpers import OrderPlaced, drain
from ...support.processes import EVENTBUS
from ._support import Procs, drained, settled, worker_id_of

# The suite's size; the full size on demand: EVENTBUS_SOAK_JOBS=5000 EVENTBUS_SOAK_KILLS=20.
JOBS = int(os.environ.get("EVENTBUS_SOAK_JOBS", 1200))
WORKERS = 3
KILLS = int(os.environ.get("EVENTBUS_SOAK_KILLS", 8))
WORKER_ARGS = ("--concurrency", "5", "--batch-size", "5", "--poll-interval", "1", "--grace", "1")
WORKER_ENV = {"TXN_LEASE": "2", "TXN_SLEEP": "0.03"}
APP = "tests.apps.txn_app:bus"


async def _app_table(target: Target) -> None:
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(
            f'CREATE TABLE "{target.schema}".app_rows (event_id bigint NOT NULL, n integer NOT NULL, '
            "pid integer NOT NULL, attempt integer NOT NULL)"
        )
        await conn.execute(
            f'CREATE TABLE "{target.schema}".wf_rows (n integer NOT NULL, version integer NOT NULL, '
            "pid integer NOT NULL)"
        )
    finally:
        await conn.close()


async def test_a_lease_taken_over_while_the_handler_runs_rolls_its_writes_back(pg_target: Target) -> None:
    """The first run blocks past its lease; another worker's sweep takes the delivery back and the
    second run commits. The first run's row, written before the takeover, is rolled back."""
    bus = pg_target.bus()
    await bus.migrate()
    await _app_table(pg_target)
    table = f'"{pg_target.schema}".app_rows'
    second_run = anyio.Event()

    def recover_elsewhere() -> int:
        async def recover() -> int:
            async with pg_target.bus() as other:
                return await other.backend.deliveries.recover_expired()

        found: list[int] = []
        thread = threading.Thread(target=lambda: found.append(anyio.run(recover)))
        thread.start()
        thread.join()
        return found[0]

    @bus.subscribe(
        OrderPlaced, name="h", lease_seconds=1.0, transactional=True, retry=RetryPolicy(max_attempts=2)
    )
    async def h(event: OrderPlaced, ctx: Context) -> None:
        await ctx.connection.execute(f"INSERT INTO {table} VALUES ($1, 0, 0, $2)", ctx.event_id, ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(1.3)  # blocks the loop: no renewal, the lease runs out
            assert recover_elsewhere() == 1  # taken back while this transaction is open
            with anyio.fail_after(10):
                await second_run.wait()
            return  # this run's commit is refused: its row goes with it
        second_run.set()

    try:
        await bus.register()
        await bus.publish(OrderPlaced(order_id="o-1"))
        (delivery_id,) = [d.id for d in await bus.find_deliveries()]
        worker = Worker(bus, poll_interval_seconds=0.1, recovery_interval_seconds=0.1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(20):
                while (detail := await bus.delivery(delivery_id)).status != "completed":
                    await anyio.sleep(0.05)
            worker.stop()
        conn = await asyncpg.connect(pg_target.dsn)
        try:
            rows = await conn.fetch(f"SELECT attempt FROM {table}")
        finally:
            await conn.close()
        assert [r["attempt"] for r in rows] == [2]
        assert detail.attempts == 2
        assert [a.error_type for a in detail.history] == ["LeaseExpired"]
    finally:
        await bus.aclose()


async def test_a_handler_allowed_past_the_dead_client_guard_keeps_its_transaction(pg_target: Target) -> None:
    """The session ends a transaction idle for ``dead_client_seconds`` (1 s here); a transactional
    handler whose timeout is longer waits 2.5 s inside its transaction and still commits."""
    bus = pg_target.bus(dead_client_seconds=1)
    await bus.migrate()
    await _app_table(pg_target)
    table = f'"{pg_target.schema}".app_rows'

    @bus.subscribe(
        OrderPlaced, name="h", transactional=True, timeout_seconds=5, retry=RetryPolicy(max_attempts=1)
    )
    async def h(event: OrderPlaced, ctx: Context) -> None:
        await ctx.connection.execute(f"INSERT INTO {table} VALUES ($1, 0, 0, $2)", ctx.event_id, ctx.attempt)
        await anyio.sleep(2.5)  # idle in the transaction, past the session's limit

    try:
        await bus.register()
        await bus.publish(OrderPlaced(order_id="o-1"))
        assert (await drain(bus)).processed == 1
        conn = await asyncpg.connect(pg_target.dsn)
        try:
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 1
        finally:
            await conn.close()
    finally:
        await bus.aclose()


async def _publish(target: Target) -> None:
    async with target.bus() as bus:
        events = [Envelope(TxnJob(n=i), key=f"j{i}") for i in range(JOBS)]
        for i in range(0, JOBS, 500):
            results = await bus.publish_many(events[i : i + 500])
            assert not any(r.duplicate for r in results)


async def _check(db: asyncpg.Connection, s: str) -> tuple[int, int]:
    """Exactly one row and one follow-up per job; returns (orphaned leases, handler reruns)."""
    statuses = {
        r[0]: r[1] for r in await db.fetch(f'SELECT status, count(*) FROM "{s}".deliveries GROUP BY 1')
    }
    assert set(statuses) == {"completed"}, statuses
    # One run of the machine per job, completed, and one row of its transactional state each.
    runs = await db.fetch(f'SELECT status, run_id FROM "{s}".wf_instances')
    assert len(runs) == JOBS and {(r["status"], r["run_id"]) for r in runs} == {("completed", 1)}
    assert await db.fetchval(f'SELECT count(*) FROM "{s}".wf_rows') == JOBS
    assert await db.fetchval(f'SELECT count(DISTINCT n) FROM "{s}".wf_rows') == JOBS
    assert await db.fetchval(f'SELECT count(*) FROM "{s}".app_rows') == JOBS
    assert await db.fetchval(f'SELECT count(DISTINCT n) FROM "{s}".app_rows') == JOBS
    follow_ups = await db.fetch(
        f'SELECT j.id, count(f.id) AS n FROM "{s}".events j LEFT JOIN "{s}".events f '
        "ON f.causation_id = j.id AND f.event_type = 'txn.followup' "
        "WHERE j.event_type = 'txn.job' GROUP BY j.id"
    )
    assert len(follow_ups) == JOBS and {r["n"] for r in follow_ups} == {1}
    # Each row was written by the run that completed the delivery (its attempt).
    mismatched = await db.fetchval(
        f'SELECT count(*) FROM "{s}".app_rows r JOIN "{s}".deliveries d ON d.event_id = r.event_id '
        f"JOIN \"{s}\".subscriptions sub ON sub.id = d.subscription_id AND sub.name = 'txn' "
        "WHERE d.attempts <> r.attempt"
    )
    assert mismatched == 0
    orphaned = await db.fetchval(
        f"SELECT count(*) FROM \"{s}\".delivery_attempts WHERE error_type IN ('LeaseExpired', 'WorkerLost')"
    )
    reruns = await db.fetchval(f'SELECT count(*) FROM "{s}".deliveries WHERE attempts > 1')
    return orphaned, reruns


async def test_kill_soak_transactional_handler(
    fault_target: Target, procs: Procs, db: asyncpg.Connection
) -> None:
    s = str(fault_target.schema)
    await _app_table(fault_target)
    rng = random.Random(20261202)

    def worker(i: int):
        return procs.spawn([EVENTBUS, "worker", APP, *WORKER_ARGS], WORKER_ENV, f"w{i}")

    workers = [worker(i) for i in range(WORKERS)]
    for w in workers:
        await worker_id_of(db, s, w.pid)
    started = time.monotonic()
    await _publish(fault_target)
    kills = 0
    while kills < KILLS and not await settled(db, s):
        await asyncio.sleep(rng.uniform(0.3, 0.8))
        i = rng.randrange(WORKERS)
        workers[i].signal(signal.SIGKILL)
        await workers[i].wait_async(5)
        kills += 1
        workers[i] = worker(i)
    assert kills == KILLS, f"the workload drained after {kills} kills: make it longer"
    await drained(db, s, "transactional soak")
    elapsed = time.monotonic() - started
    orphaned, reruns = await _check(db, s)
    done = await db.fetchval(f'SELECT count(*) FROM "{s}".deliveries')
    assert orphaned > 0, "no kill left a claimed delivery behind"
    print(
        f"\ntransactional kill soak (postgres): {KILLS} SIGKILLs, {orphaned} orphaned leases, "
        f"{reruns} deliveries run more than once; {done} deliveries in {elapsed:.1f}s"
    )


async def test_sigkill_mid_transaction_leaves_no_writes(
    fault_target: Target, procs: Procs, db: asyncpg.Connection
) -> None:
    """A worker killed while its handlers' transactions are open: the server rolls them back, and the
    deliveries' next runs write the only rows."""
    s = str(fault_target.schema)
    await _app_table(fault_target)
    w = procs.spawn([EVENTBUS, "worker", APP, *WORKER_ARGS], {**WORKER_ENV, "TXN_SLEEP": "30"}, "slow")
    await worker_id_of(db, s, w.pid)
    async with fault_target.bus() as bus:
        await bus.publish_many([Envelope(TxnJob(n=i), key=f"j{i}") for i in range(5)])
    deadline = time.monotonic() + 20
    while await db.fetchval(f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'processing'") < 5:
        assert time.monotonic() < deadline, "the slow worker never claimed the jobs"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # the inserts are done; the transactions wait in the handlers' sleep
    w.signal(signal.SIGKILL)
    await w.wait_async(5)
    assert await db.fetchval(f'SELECT count(*) FROM "{s}".app_rows') == 0
    procs.spawn([EVENTBUS, "worker", APP, *WORKER_ARGS], WORKER_ENV, "fast")
    await drained(db, s, "after the kill", stall=20)
    assert await db.fetchval(f'SELECT count(*) FROM "{s}".app_rows') == 5
    assert await db.fetchval(f'SELECT count(*) FROM "{s}".app_rows WHERE attempt = 2') == 5
