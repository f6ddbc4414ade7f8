"""Worker application for the fault-injection suite (tests/faults/postgres).

Run as ``eventbus worker tests.apps.fault_app:bus``. The bus is built from
``EVENTBUS_DSN`` / ``EVENTBUS_SCHEMA``; the handlers are steered by env vars:

``FAULT_LEASE``          lease seconds of every subscription (default 2)
``FAULT_SLEEP``          seconds each order/audit handler sleeps (default 0)
``FAULT_HANG_SECONDS``   seconds the ``fault.hang`` handler sleeps (default 0)
``FAULT_FIXED``          "1": the always-failing handler succeeds
``FAULT_MAX_ATTEMPTS``   max attempts of the failing subscription (default 4)
``FAULT_BASE_DELAY``     base retry delay of the failing subscription (default 0.5)
``FAULT_MAX_PAYLOAD``    the bus's max_payload_bytes (default 1 MiB)

Every handler run is recorded durably, before and after the handler's work,
in ``<schema>.handler_runs`` (created by the test) through its own asyncpg
pool, so a test can count runs per delivery and per process with SQL.
"""

from __future__ import annotations

import asyncio
import os

import asyncpg

from eventbus import Bus, Context, RetryPolicy

from .fault_events import Audit, Flaky, FollowUp, Hang, Order


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


LEASE = _env_float("FAULT_LEASE", 2.0)
SLEEP = _env_float("FAULT_SLEEP", 0.0)
SCHEMA = os.environ.get("EVENTBUS_SCHEMA", "eventbus")
PID = os.getpid()

bus = Bus(max_payload_bytes=int(os.environ.get("FAULT_MAX_PAYLOAD", 1024 * 1024)))

_pool: asyncpg.Pool | None = None
_pool_lock: asyncio.Lock | None = None


async def _record(ctx: Context, phase: str) -> None:
    global _pool, _pool_lock
    if _pool is None:
        if _pool_lock is None:
            _pool_lock = asyncio.Lock()
        async with _pool_lock:
            if _pool is None:
                _pool = await asyncpg.create_pool(os.environ["EVENTBUS_DSN"], min_size=1, max_size=2)
    await _pool.execute(
        f'INSERT INTO "{SCHEMA}".handler_runs '
        "(event_id, delivery_id, subscription, pid, attempt, phase) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        ctx.event_id,
        ctx.delivery_id,
        ctx.subscription,
        PID,
        ctx.attempt,
        phase,
    )


@bus.subscribe(Order, name="order", lease_seconds=LEASE)
async def on_order(event: Order, ctx: Context) -> None:
    await _record(ctx, "start")
    if SLEEP:
        await asyncio.sleep(SLEEP)
    ctx.emit(FollowUp(parent=ctx.key or str(ctx.event_id)), key=f"f:{ctx.key}")
    await _record(ctx, "end")


@bus.subscribe(Audit, name="audit", lease_seconds=LEASE)
async def on_audit(event: Audit, ctx: Context) -> None:
    await _record(ctx, "start")
    if SLEEP:
        await asyncio.sleep(SLEEP)
    await _record(ctx, "end")


@bus.subscribe(FollowUp, name="followup", lease_seconds=LEASE)
async def on_followup(event: FollowUp, ctx: Context) -> None:
    await _record(ctx, "start")
    await _record(ctx, "end")


@bus.subscribe(
    Flaky,
    name="flaky",
    lease_seconds=LEASE,
    retry=RetryPolicy(
        max_attempts=int(os.environ.get("FAULT_MAX_ATTEMPTS", 4)),
        base_delay_seconds=_env_float("FAULT_BASE_DELAY", 0.5),
        jitter=0.0,
    ),
)
async def on_flaky(event: Flaky, ctx: Context) -> None:
    await _record(ctx, "start")
    if os.environ.get("FAULT_FIXED") != "1":
        raise RuntimeError(f"flaky handler broken (event {event.n}, attempt {ctx.attempt})")
    await _record(ctx, "end")


@bus.subscribe(Hang, name="hang", lease_seconds=LEASE)
async def on_hang(event: Hang, ctx: Context) -> None:
    await _record(ctx, "start")
    await asyncio.sleep(_env_float("FAULT_HANG_SECONDS", 0.0))
    ctx.emit(FollowUp(parent=f"hang:{ctx.key}"), key=f"hang:{ctx.key}")
    await _record(ctx, "end")
