"""An always-failing handler: retries follow the policy, dead rows explain
themselves, and after the fix `eventbus dlq replay --all` completes them."""

from __future__ import annotations

import signal

from eventbus import Envelope

from ...apps.fault_events import Flaky
from ._support import wait_until, worker_id_of

EVENTS = 10
MAX_ATTEMPTS = 4
BASE = 0.5  # delays after attempts 1, 2, 3: 0.5, 1.0, 2.0 (jitter 0)
SLACK = 1.0  # claim latency allowed beyond the policy's delay


async def test_always_failing_then_replay(fault_target, procs, db) -> None:
    s = fault_target.schema
    env = {"FAULT_MAX_ATTEMPTS": str(MAX_ATTEMPTS), "FAULT_BASE_DELAY": str(BASE), "FAULT_LEASE": "10"}
    broken = procs.worker("--poll-interval", "5", env=env, name="broken")
    await worker_id_of(db, s, broken.pid)
    bus = fault_target.bus()
    async with bus:
        await bus.publish_many([Envelope(Flaky(n=i), key=f"f{i}") for i in range(EVENTS)])

    async def all_dead() -> bool:
        return await db.fetchval(f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'dead'") == EVENTS

    await wait_until(all_dead, 30, interval=0.1, what="every delivery to go dead")
    rows = await db.fetch(f'SELECT * FROM "{s}".deliveries ORDER BY id')
    assert len(rows) == EVENTS
    for row in rows:
        assert row["attempts"] == MAX_ATTEMPTS
        assert row["last_error"].startswith("RuntimeError: flaky handler broken")
        history = await db.fetch(
            f'SELECT * FROM "{s}".delivery_attempts WHERE delivery_id = $1 ORDER BY id', row["id"]
        )
        assert [h["attempt"] for h in history] == list(range(1, MAX_ATTEMPTS + 1))
        assert all(h["error_type"] == "RuntimeError" and "Traceback" in h["traceback"] for h in history)
        for n in range(1, MAX_ATTEMPTS):  # by database time
            gap = (history[n]["failed_at"] - history[n - 1]["failed_at"]).total_seconds()
            want = BASE * 2 ** (n - 1)
            assert want <= gap <= want + SLACK, (
                f"delivery {row['id']}: gap after attempt {n} was {gap:.3f}s, policy {want}s"
            )
    runs = await db.fetchval(f"SELECT count(*) FROM \"{s}\".handler_runs WHERE phase = 'start'")
    assert runs == EVENTS * MAX_ATTEMPTS

    # "Fix" the handler: restart the worker with FAULT_FIXED=1, then replay.
    broken.signal(signal.SIGTERM)
    assert await broken.wait_async(15) == 0, broken.output()
    fixed = procs.worker("--poll-interval", "5", env={**env, "FAULT_FIXED": "1"}, name="fixed")
    await worker_id_of(db, s, fixed.pid)
    result = procs.cli("dlq", "replay", "--all", "--yes")
    assert result.returncode == 0, result.stderr + result.stdout

    async def all_completed() -> bool:
        return (
            await db.fetchval(f"SELECT count(*) FROM \"{s}\".deliveries WHERE status = 'completed'") == EVENTS
        )

    await wait_until(
        all_completed, 4, interval=0.05, what="replayed deliveries to complete (woken by NOTIFY)"
    )
    assert (
        await db.fetchval(f'SELECT count(*) FROM "{s}".deliveries WHERE replays <> 1 OR attempts <> 1') == 0
    )
    assert (
        await db.fetchval(
            f"SELECT count(DISTINCT delivery_id) FROM \"{s}\".handler_runs WHERE phase = 'end' AND pid = $1",
            fixed.pid,
        )
        == EVENTS
    )
