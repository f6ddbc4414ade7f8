"""Real worker processes: SIGKILL mid-poll and restart; three workers never overlap visits of one instance."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from eventbus import Bus
from tests.apps.workflow_app import GPU_SCHEMA, Retrain, m

from ...conftest import Target
from ...support.processes import EVENTBUS, ProcessGroup

APP = "tests.apps.workflow_app:bus"
WORKER = [EVENTBUS, "worker", APP, "--poll-interval", "0.2", "--recovery-interval", "0.5", "--grace", "1"]


@pytest.fixture
async def group(tmp_path: Path) -> AsyncIterator[ProcessGroup]:
    procs = ProcessGroup(tmp_path)
    try:
        yield procs
    finally:
        await procs.aclose()


def gpu_db(tmp_path: Path) -> Path:
    path = tmp_path / "gpu.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(GPU_SCHEMA)
    return path


async def start_all(target: Target, keys: list[str]) -> Bus:
    bus = target.bus()
    bus.include(m)
    await bus.migrate()
    for key in keys:
        await bus.workflows.start(m, Retrain(customer=key))
    return bus


async def wait_for(what: str, check: Any, timeout: float, group: ProcessGroup) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            logs = "\n".join(p.output()[-2000:] for p in group.all)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        await asyncio.sleep(0.1)


async def counts(bus: Bus) -> dict[tuple[str, str], int]:
    return await bus.workflows.counts(m)


async def busy_while_waiting(bus: Bus) -> tuple[set[str], int]:
    """(instances past three quarters of their wait, step deliveries processing for them), in one snapshot.

    A visit's delivery completes one result flush after its transition commits,
    so only an instance that yielded a moment ago may still show one; a
    delivery held through the wait would still be processing near its end (the
    flush of a busy machine may lag, never by most of a wait).
    """
    sql = (
        "SELECT i.key, count(d.id) FROM {s}wf_instances i LEFT JOIN {s}deliveries d "
        "ON d.ordering_key = i.machine || '/' || i.key AND d.status = 'processing' "
        "WHERE i.status = 'waiting' AND i.next_run_at > {now} "
        "AND i.updated_at < {now} - (i.next_run_at - i.updated_at) * 3 / 4 GROUP BY i.key"
    )
    backend: Any = bus.backend
    if bus.backend.kind == "postgres":
        async with backend.db.conn() as conn:
            rows = await conn.fetch(sql.format(s=f'"{backend.schema_name}".', now="now()"))
    else:
        now = "(julianday('now') - 2440587.5) * 86400.0"
        rows = await backend.db.read(lambda c: c.execute(sql.format(s="", now=now)).fetchall())
    return {str(r[0]) for r in rows}, sum(int(r[1]) for r in rows)


async def test_sigkill_every_worker_mid_poll_then_every_machine_finishes(
    target: Target, tmp_path: Path, group: ProcessGroup
) -> None:
    keys = [f"c-{i}" for i in range(30)]
    # The jobs run until the test releases them, after the restart: however slowly
    # a busy machine starts the 30 machines, none finishes before the kills.
    env = {**target.env(), "GPU_DB": str(gpu_db(tmp_path)), "JOB_SECONDS": "3600", "POLL_SECONDS": "2"}
    bus = await start_all(target, keys)
    try:
        workers = [group.spawn(WORKER, env, f"w{i}") for i in range(2)]

        async def all_polling() -> bool:
            c = await counts(bus)
            return c.get(("POLL_JOB", "waiting"), 0) == len(keys)

        await wait_for("every machine to be mid-poll", all_polling, 30, group)
        seen: set[str] = set()
        for _ in range(40):  # over a whole poll period
            waiting, processing = await busy_while_waiting(bus)
            assert processing == 0, "a yielded instance held a delivery"
            seen |= waiting
            await asyncio.sleep(0.05)
        assert len(seen) >= len(keys) // 2
        for w in workers:
            w.signal(signal.SIGKILL)
        for w in workers:
            assert await w.wait_async(10) == -signal.SIGKILL
        assert (await counts(bus)).get(("POLL_JOB", "waiting"), 0) == len(keys)
        for i in range(2):
            group.spawn(WORKER, env, f"r{i}")
        with sqlite3.connect(env["GPU_DB"]) as conn:
            conn.execute("UPDATE jobs SET finish_at = 0")

        async def all_done() -> bool:
            return (await counts(bus)) == {("DONE", "completed"): len(keys)}

        await wait_for("every machine to finish after the restart", all_done, 60, group)
        with sqlite3.connect(env["GPU_DB"]) as conn:
            jobs = conn.execute(
                "SELECT customer, count(*), sum(submits) FROM jobs GROUP BY customer"
            ).fetchall()
        assert sorted(j[0] for j in jobs) == sorted(keys)
        assert all(n == 1 and submits == 1 for _, n, submits in jobs), "no job was submitted twice"
        for key in keys:
            inst = await bus.workflows.instance(m, key)
            assert inst.visits["SUBMIT_JOB"] == 1 and inst.visits["POLL_JOB"] >= 2
    finally:
        await bus.aclose()


async def _overlap_was_a_lapsed_lease(
    bus: Bus, key: str, earlier: tuple[str, int, float, float], later: tuple[str, int, float, float]
) -> None:
    """Two runs of one instance overlap only when the first outlived its lease (a machine too
    busy to renew it), and then the first one's commit was refused."""
    state, pid, t0, _t1 = earlier
    assert later[2] - t0 >= m.lease_seconds, f"two visits of {key} overlapped within a lease"
    committed = [
        row
        for row in await bus.history(m, key)
        if row.state == state and row.actor.endswith(f":{pid}") and abs(row.started_at.timestamp() - t0) < 0.5
    ]
    assert committed == [], f"two overlapping visits of {key} both committed"


async def test_three_workers_never_overlap_visits_of_one_instance(
    target: Target, tmp_path: Path, group: ProcessGroup
) -> None:
    keys = [f"k-{i}" for i in range(200)]
    env = {**target.env(), "GPU_DB": str(gpu_db(tmp_path)), "JOB_SECONDS": "0.3", "STATE_SECONDS": "0.01"}
    bus = await start_all(target, [])
    try:
        for i in range(3):
            group.spawn(WORKER, env, f"w{i}")
        for key in keys:
            await bus.workflows.start(m, Retrain(customer=key))

        async def all_done() -> bool:
            return (await counts(bus)) == {("DONE", "completed"): len(keys)}

        await wait_for("200 machines to finish", all_done, 120, group)
        with sqlite3.connect(env["GPU_DB"]) as conn:
            runs = conn.execute("SELECT key, state, pid, t0, t1 FROM runs ORDER BY key, t0").fetchall()
        assert len({run[2] for run in runs}) == 3, "all three workers took part"
        by_key: dict[str, list[tuple[str, int, float, float]]] = {}
        for key, state, pid, t0, t1 in runs:
            by_key.setdefault(key, []).append((state, pid, t0, t1))
        for key, spans in by_key.items():
            for first, second in itertools.pairwise(spans):
                if second[2] < first[3]:
                    await _overlap_was_a_lapsed_lease(bus, key, first, second)
        for key in keys[:50]:
            rows = await bus.workflows.history(m, key)
            for earlier, later in itertools.pairwise(rows):
                assert later.started_at >= earlier.at, f"history of {key}: visits overlapped"
    finally:
        await bus.aclose()
