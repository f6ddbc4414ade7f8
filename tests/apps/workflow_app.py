"""A worker application for the state-machine process tests.

A pretend GPU service lives in its own SQLite file (``$GPU_DB``) shared by
every process: ``jobs`` (one row per idempotency key; ``submits`` counts
calls) and ``runs`` (every state function run with its pid and start and end
times, including runs whose commit was later refused).
"""

from __future__ import annotations

import os
import sqlite3
import time

import anyio
import anyio.to_thread
import msgspec

from eventbus import Bus
from eventbus.workflows import Machine, StepContext, Yield

GPU_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (idem TEXT PRIMARY KEY, customer TEXT NOT NULL,
    finish_at REAL NOT NULL, submits INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL, state TEXT NOT NULL, pid INTEGER NOT NULL,
    t0 REAL NOT NULL, t1 REAL NOT NULL);
"""


def gpu() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["GPU_DB"], timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    return conn


class Retrain(msgspec.Struct):
    customer: str
    job_id: str | None = None


m = Machine("retrain", checkpoint=Retrain, key=lambda c: c.customer, lease_seconds=5.0)
bus = Bus()


def _sql(sql: str, *params: object) -> list[tuple[object, ...]]:
    with gpu() as conn:
        return conn.execute(sql, params).fetchall()


async def gpu_call(sql: str, *params: object) -> list[tuple[object, ...]]:
    """One statement on the GPU file, off the event loop (the lease heartbeat keeps running)."""
    return await anyio.to_thread.run_sync(lambda: _sql(sql, *params))


async def _record(ctx: StepContext, t0: float) -> None:
    t1 = time.time()
    await gpu_call("INSERT INTO runs VALUES (?, ?, ?, ?, ?)", ctx.key, ctx.state, os.getpid(), t0, t1)


async def _work() -> None:
    await anyio.sleep(float(os.environ.get("STATE_SECONDS", "0.005")))


@m.state(initial=True, on_success="SUBMIT_JOB", on_failure="DONE")
async def INITIAL(c: Retrain, ctx: StepContext) -> None:
    t0 = time.time()
    await _work()
    await _record(ctx, t0)


@m.state(on_success="POLL_JOB", on_failure="SUBMIT_JOB", max_visits=3)
async def SUBMIT_JOB(c: Retrain, ctx: StepContext) -> None:
    t0 = time.time()
    finish_at = time.time() + float(os.environ.get("JOB_SECONDS", "0.3"))
    await gpu_call(
        "INSERT INTO jobs (idem, customer, finish_at) VALUES (?, ?, ?) "
        "ON CONFLICT (idem) DO UPDATE SET submits = submits + 1",
        ctx.op_key,
        c.customer,
        finish_at,
    )
    c.job_id = ctx.op_key
    await _work()
    await _record(ctx, t0)


@m.state(on_success="DONE", on_failure="POLL_JOB", continue_run=False, poll=0.1, max_visits=400)
async def POLL_JOB(c: Retrain, ctx: StepContext) -> Yield | None:
    t0 = time.time()
    ((finish_at,),) = await gpu_call("SELECT finish_at FROM jobs WHERE idem = ?", c.job_id)
    assert isinstance(finish_at, float)
    await _work()
    await _record(ctx, t0)
    return Yield(poll=float(os.environ.get("POLL_SECONDS", "0.1"))) if time.time() < finish_at else None


m.terminal("DONE")
bus.include(m)
