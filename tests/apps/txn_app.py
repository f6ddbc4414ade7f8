"""Worker application of the transactional-handler kill soaks (PostgreSQL and SQLite).

Run as ``eventbus worker tests.apps.txn_app:bus``; the bus comes from
``EVENTBUS_DSN`` (and ``EVENTBUS_SCHEMA`` on PostgreSQL). The ``txn`` handler
is transactional: it inserts one row into the application's table
``app_rows`` (created by the test, with no unique constraint, so a second
commit of one event would show as a second row) through ``ctx.connection``,
waits ``TXN_SLEEP`` seconds inside its transaction, and emits one follow-up
without a key (so a second commit would show as a second follow-up).

It also starts, with ctx.start, one run of the ``record`` machine per job,
whose transactional state ``WRITE`` inserts one row into ``wf_rows`` (no
unique constraint either) in the transaction of its transition.

``TXN_LEASE``   lease seconds of both subscriptions and of the machine's steps (default 2)
``TXN_SLEEP``   seconds the transactional handler waits inside its transaction (default 0)
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from eventbus import Bus, Context, RetryPolicy
from eventbus.workflows import FAILED, Machine, StepContext

from .txn_events import TxnFollowUp, TxnJob

LEASE = float(os.environ.get("TXN_LEASE", 2.0))
SLEEP = float(os.environ.get("TXN_SLEEP", 0.0))
SQLITE = os.environ.get("EVENTBUS_DSN", "").startswith("sqlite:")
TABLE = "app_rows" if SQLITE else f'"{os.environ.get("EVENTBUS_SCHEMA", "eventbus")}".app_rows'
RETRY = RetryPolicy(max_attempts=25, base_delay_seconds=0.05, jitter=0.0)

WF_TABLE = "wf_rows" if SQLITE else f'"{os.environ.get("EVENTBUS_SCHEMA", "eventbus")}".wf_rows'

bus = Bus()


class Record(msgspec.Struct):
    n: int


record = Machine("record", checkpoint=Record, key=lambda c: f"r{c.n}", lease_seconds=LEASE)


@record.state(initial=True, on_success="DONE", on_failure=FAILED, transactional=True)
async def WRITE(c: Record, ctx: StepContext) -> None:
    if SQLITE:
        sql = f"INSERT INTO {WF_TABLE} (n, version, pid) VALUES (?, ?, ?)"
        await ctx.connection.execute(sql, (c.n, ctx.version, os.getpid()))
    else:
        sql = f"INSERT INTO {WF_TABLE} (n, version, pid) VALUES ($1, $2, $3)"
        await ctx.connection.execute(sql, c.n, ctx.version, os.getpid())


record.terminal("DONE")
bus.include(record)


@bus.subscribe(TxnJob, name="txn", lease_seconds=LEASE, retry=RETRY, transactional=True)
async def on_job(event: TxnJob, ctx: Context) -> None:
    if SQLITE:
        sql = f"INSERT INTO {TABLE} (event_id, n, pid, attempt) VALUES (?, ?, ?, ?)"
        await ctx.connection.execute(sql, (ctx.event_id, event.n, os.getpid(), ctx.attempt))
    else:
        sql = f"INSERT INTO {TABLE} (event_id, n, pid, attempt) VALUES ($1, $2, $3, $4)"
        await ctx.connection.execute(sql, ctx.event_id, event.n, os.getpid(), ctx.attempt)
    if SLEEP:
        await asyncio.sleep(SLEEP)
    ctx.emit(TxnFollowUp(n=event.n))
    ctx.start(record, Record(n=event.n))


@bus.subscribe(TxnFollowUp, name="followup", lease_seconds=LEASE, retry=RETRY)
async def on_followup(event: TxnFollowUp, ctx: Context) -> None:
    pass
