"""PostgreSQL restarts mid-run (fast, then immediate) under a publisher and workers.

Runs on a throwaway server (tests/pgserver.py), never the shared one. Every
acknowledged publish must be stored and processed; failed publishes raise a
typed eventbus error; the workers recover without being restarted.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import traceback

import asyncpg

from eventbus import BackendError, Envelope

from ...apps.fault_events import Order
from ...conftest import Target
from ...support.pgserver import PgServer
from ._support import Procs, prepare, wait_until, worker_id_of


async def test_postgres_restart(tmp_path) -> None:
    server = await asyncio.to_thread(lambda: PgServer().start())
    procs: Procs | None = None
    try:
        target = Target("postgres", server.dsn, "fault_restart")
        await prepare(target)
        s = "fault_restart"
        procs = Procs(target, tmp_path)
        env = {"FAULT_LEASE": "5", "FAULT_SLEEP": "0.01"}
        workers = [procs.worker("--poll-interval", "1", env=env, name=f"w{i}") for i in range(2)]
        db = await asyncpg.connect(server.dsn)
        try:
            for w in workers:
                await worker_id_of(db, s, w.pid)
        finally:
            await db.close()

        acked: dict[str, int] = {}
        errors: list[BaseException] = []
        first_ack_after: dict[str, float] = {}
        restarted_at: dict[str, float] = {}
        ack_times: list[float] = []
        begun: dict[str, float] = {}
        stop = asyncio.Event()
        bus = target.bus()

        async def publisher() -> None:
            i = 0
            while not stop.is_set():
                key = f"p{i}"
                i += 1
                try:
                    (r,) = await asyncio.wait_for(bus.publish_many([Envelope(Order(n=i), key=key)]), 30)
                except Exception as exc:
                    errors.append(exc)
                    await asyncio.sleep(0.05)
                    continue
                acked[key] = r.event_id
                now = time.monotonic()
                ack_times.append(now)
                for mode, at in restarted_at.items():
                    first_ack_after.setdefault(mode, now - at)
                await asyncio.sleep(0.005)

        async with bus:
            task = asyncio.create_task(publisher())
            try:
                for mode in ("fast", "immediate"):
                    await asyncio.sleep(2.0)
                    before = len(acked)
                    begun[mode] = time.monotonic()
                    await asyncio.to_thread(server.restart, mode)
                    restarted_at[mode] = time.monotonic()
                    assert len(acked) >= before
                await asyncio.sleep(3.0)
            finally:
                stop.set()
                await asyncio.wait_for(task, 40)

        assert acked, "nothing was acknowledged"
        untyped = [e for e in errors if not isinstance(e, BackendError)]
        assert not untyped, (
            "".join(traceback.format_exception(untyped[0])) + f"\n{len(untyped)} untyped errors"
        )
        assert all(mode in first_ack_after for mode in ("fast", "immediate"))

        db = await asyncpg.connect(server.dsn)
        try:

            async def processed() -> bool:
                n = await db.fetchval(
                    f'SELECT count(*) FROM "{s}".events e JOIN "{s}".deliveries d '
                    f'ON d.event_id = e.id JOIN "{s}".subscriptions sub ON '
                    "sub.id = d.subscription_id AND sub.name = 'order' "
                    "WHERE e.key = ANY($1::text[]) AND d.status = 'completed'",
                    list(acked),
                )
                return n == len(acked)

            t0 = time.monotonic()
            await wait_until(processed, 40, interval=0.2, what="acknowledged events processed")
            drained = time.monotonic() - t0
            ids = await db.fetch(f"SELECT key, id FROM \"{s}\".events WHERE event_type = 'fault.order'")
            stored = {r["key"]: r["id"] for r in ids}
            assert all(stored.get(k) == v for k, v in acked.items()), "an acked publish is lost"
            # The follow-ups of acknowledged events exist exactly once.
            assert await db.fetchval(
                f"SELECT count(*) FROM \"{s}\".events WHERE event_type = 'fault.followup' "
                "AND key = ANY($1::text[])",
                [f"f:{k}" for k in acked],
            ) == len(acked)
            assert (
                await db.fetchval(
                    f'SELECT count(*) FROM (SELECT delivery_id FROM "{s}".transitions '
                    "WHERE new_status = 'completed' GROUP BY 1 HAVING count(*) > 1) t"
                )
                == 0
            )
            # The workers' outage: the longest pause between completions (database clock).
            worker_gap = await db.fetchval(
                f"SELECT max(gap) FROM (SELECT extract(epoch FROM at - lag(at) OVER "
                f'(ORDER BY at))::float8 AS gap FROM "{s}".transitions '
                "WHERE new_status = 'completed') t"
            )
        finally:
            await db.close()
        assert all(w.alive() for w in workers), "a worker died with the database"
        kinds = sorted({type(e).__name__ for e in errors})
        # The publishers' outage around each restart: the pause between acknowledgements.
        outage = {
            mode: max(b - a for a, b in itertools.pairwise(ack_times) if b >= begun[mode] and a <= at)
            for mode, at in restarted_at.items()
        }
        took = {mode: restarted_at[mode] - begun[mode] for mode in begun}
        print(
            f"\nPostgreSQL restart: {len(acked)} acked, {len(errors)} publishes raised "
            f"{kinds}; first ack after restart: fast {first_ack_after['fast']:.2f}s, "
            f"immediate {first_ack_after['immediate']:.2f}s (after pg_ctl reported ready); "
            f"pg_ctl restart took fast {took['fast']:.2f}s, immediate {took['immediate']:.2f}s; "
            f"publish pause around restart: fast {outage['fast']:.2f}s, immediate "
            f"{outage['immediate']:.2f}s; longest pause between completions "
            f"{worker_gap:.2f}s; backlog drained {drained:.1f}s after publishing stopped"
        )
    finally:
        if procs is not None:
            await procs.aclose()
        await asyncio.to_thread(server.destroy)
