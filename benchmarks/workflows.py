"""Durable state machines: transitions per second, and what waiting instances cost.

    python -m benchmarks.workflows --backend postgres
    python -m benchmarks.workflows --backend sqlite

Scenarios, each on a scratch schema or file:

- ``transitions``: ``--instances`` (1,000) instances step through ``--states``
  (10) ``continue_run`` states into a terminal; one in-process worker;
  transitions/s = committed history rows / wall time from the first start.
- ``waiting``: ``--waiting`` (10,000) instances yield in a poll state. First
  with a poll far away (the pure wait: claims/s and rows written over the
  window should be zero; measured after the statistics of the first visits
  are in), then with ``--poll`` (5 s) seconds: polls/s and row
  writes per poll. Row writes are PostgreSQL's ``n_tup_ins + n_tup_upd +
  n_tup_del`` over the schema; on SQLite they are counted from the tables
  (inserts of events, deliveries and history; one claim and one completion
  update per delivery; one pointer update per visit).
- ``children``: one parent run fans out ``--children`` (10,000) child runs in
  one visit (``ctx.start`` each, committed with its transition) and waits on
  them with ``Yield(children="all")``; each child runs one state into a
  terminal. Start rate = children / seconds from the parent's start until it
  waits with every child linked (its visit and the one commit included);
  fan-in rate = children / seconds from then until the parent, woken once
  by the last child's end, has read every outcome and completed.

    python -m benchmarks.workflows --backend postgres --scenario children
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from typing import Any

import anyio
import asyncpg
import msgspec

from eventbus import Bus, Worker
from eventbus.workflows import Machine, StepContext, Yield

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
STATS_LAG = 11.0
"""Seconds after which every PostgreSQL session has reported its row counts (an idle one waits 10 s)."""


class Step(msgspec.Struct):
    key: str
    n: int = 0


def chain(states: int) -> Machine[Step]:
    m = Machine("bench-chain", checkpoint=Step, key=lambda c: c.key)
    for i in range(states):

        async def advance(c: Step, ctx: StepContext) -> None:
            c.n += 1

        nxt = f"S{i + 1}" if i + 1 < states else "DONE"
        m.state(initial=i == 0, on_success=nxt, on_failure="DONE", name=f"S{i}")(advance)
    m.terminal("DONE")
    return m


def waiter(poll: float, name: str) -> Machine[Step]:
    m = Machine(name, checkpoint=Step, key=lambda c: c.key)

    @m.state(
        initial=True, on_success="DONE", on_failure="DONE", continue_run=False, poll=poll, max_visits=10**6
    )
    async def WAIT(c: Step, ctx: StepContext) -> Yield:
        c.n += 1
        return Yield()

    m.terminal("DONE")
    return m


class Fan(msgspec.Struct):
    key: str
    n: int
    read: int = 0


def fan_machines() -> tuple[Machine[Fan], Machine[Step]]:
    kid = Machine("bench-kid", checkpoint=Step, key=lambda c: c.key)

    @kid.state(initial=True, on_success="DONE", on_failure="DONE")
    async def WORK(c: Step, ctx: StepContext) -> None:
        c.n += 1

    kid.terminal("DONE")
    fan = Machine("bench-fan", checkpoint=Fan, key=lambda c: c.key, lease_seconds=300.0)

    @fan.state(initial=True, on_success="DONE", on_failure="DONE", continue_run=False, children=kid,
               max_visits=3)  # fmt: skip
    async def FAN(c: Fan, ctx: StepContext) -> Yield | None:
        if not ctx.children:
            for i in range(c.n):
                ctx.start(kid, Step(key=f"{c.key}-{i}"))
            return Yield(children="all")
        c.read = sum(1 for child in ctx.children if child.ok)
        return None

    fan.terminal("DONE")
    return fan, kid


class Target:
    def __init__(self, backend: str, dsn: str) -> None:
        self.backend = backend
        self.schema = f"bench_{uuid.uuid4().hex[:10]}" if backend == "postgres" else None
        self.dsn = dsn if backend == "postgres" else f"sqlite:///{tempfile.mkdtemp()}/bench.db"

    def bus(self) -> Bus:
        return Bus(self.dsn, schema=self.schema)

    async def drop(self) -> None:
        if self.schema:
            conn = await asyncpg.connect(self.dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            finally:
                await conn.close()

    async def row_writes(self, bus: Bus) -> int:
        backend: Any = bus.backend
        if self.schema:
            async with backend.db.conn() as conn:
                await conn.execute("SELECT pg_stat_force_next_flush()")
                sql = (
                    "SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables"
                    " WHERE schemaname = $1"
                )
                value = await conn.fetchval(sql, self.schema)
            return int(value or 0)
        sql = (
            "SELECT (SELECT count(*) FROM events) + 3 * (SELECT count(*) FROM deliveries)"
            " + 2 * (SELECT count(*) FROM wf_history)"
        )
        return int((await backend.db.read(lambda c: c.execute(sql).fetchone()))[0])


async def start_all(bus: Bus, m: Machine[Step], n: int) -> None:
    limiter = anyio.Semaphore(32)

    async def one(i: int) -> None:
        async with limiter:
            await bus.workflows.start(m, Step(key=f"k{i}"))

    await bus.workflows.start(m, Step(key="k0"))  # registers the step subscription once
    async with anyio.create_task_group() as tg:
        for i in range(1, n):
            tg.start_soon(one, i)


async def wait_until(check: Any, timeout: float) -> None:
    with anyio.fail_after(timeout):
        while not await check():  # noqa: ASYNC110 (polls the database)
            await anyio.sleep(0.1)


async def transitions(target: Target, instances: int, states: int) -> dict[str, Any]:
    m = chain(states)
    bus = target.bus()
    bus.include(m)
    await bus.migrate()
    async with bus:
        worker = Worker(bus, poll_interval_seconds=0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            began = time.perf_counter()
            await start_all(bus, m, instances)

            async def done() -> bool:
                return (await bus.workflows.counts(m)).get(("DONE", "completed"), 0) == instances

            await wait_until(done, 600)
            elapsed = time.perf_counter() - began
            worker.stop()
        committed = instances * states
        return {
            "scenario": "transitions",
            "backend": target.backend,
            "instances": instances,
            "states": states,
            "transitions": committed,
            "seconds": round(elapsed, 2),
            "transitions_per_second": round(committed / elapsed),
        }


async def waiting(target: Target, n: int, poll: float, window: float) -> dict[str, Any]:
    far = waiter(3600.0, "bench-wait")
    bus = target.bus()
    bus.include(far)
    out: dict[str, Any] = {
        "scenario": "waiting",
        "backend": target.backend,
        "instances": n,
        "window_s": window,
    }
    await bus.migrate()
    async with bus:
        worker = Worker(bus, poll_interval_seconds=1.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            began = time.perf_counter()
            await start_all(bus, far, n)

            async def all_waiting() -> bool:
                return (await bus.workflows.counts(far)).get(("WAIT", "waiting"), 0) == n

            await wait_until(all_waiting, 600)
            out["start_and_first_visit_s"] = round(time.perf_counter() - began, 2)
            await anyio.sleep(STATS_LAG)  # PostgreSQL: idle sessions report their row counts late
            out["idle"] = await _measure(target, bus, worker, window)
            worker.stop()
    out["polling"] = await _polling(target, n, poll, window)
    return out


async def _measure(target: Target, bus: Bus, worker: Worker, window: float) -> dict[str, Any]:
    writes, processed = await target.row_writes(bus), worker.processed
    await anyio.sleep(window)
    writes, processed = await target.row_writes(bus) - writes, worker.processed - processed
    return {
        "claims_per_second": round(processed / window, 1),
        "row_writes": writes,
        "row_writes_per_second": round(writes / window, 1),
        "row_writes_per_claim": round(writes / processed, 2) if processed else None,
    }


async def _polling(target: Target, n: int, poll: float, window: float) -> dict[str, Any]:
    """The same instances, rewritten to poll every ``poll`` seconds (a second machine, scratch data)."""
    m = waiter(poll, "bench-poll")
    bus = target.bus()
    bus.include(m)
    async with bus:
        worker = Worker(bus, poll_interval_seconds=1.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await start_all(bus, m, n)
            await anyio.sleep(poll * 2)  # reach the steady state
            result = await _measure(target, bus, worker, window)
            worker.stop()
    return {"poll_s": poll, **result}


async def children(target: Target, n: int) -> dict[str, Any]:
    fan, kid = fan_machines()
    bus = target.bus()
    bus.include(fan)
    bus.include(kid)
    await bus.migrate()
    async with bus:
        worker = Worker(bus, poll_interval_seconds=0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            began = time.perf_counter()
            await bus.workflows.start(fan, Fan(key="p", n=n))

            async def waiting() -> bool:
                inst = await bus.workflows.instance(fan, "p")
                return inst.status in ("waiting", "completed")

            await wait_until(waiting, 900)
            fanned = time.perf_counter()

            async def done() -> bool:
                return (await bus.workflows.instance(fan, "p")).status == "completed"

            await wait_until(done, 1800)
            ended = time.perf_counter()
            worker.stop()
        parent = await bus.workflows.instance(fan, "p")
    assert parent.checkpoint.read == n and parent.visits == {"FAN": 2}, parent
    return {
        "scenario": "children",
        "backend": target.backend,
        "children": n,
        "start_seconds": round(fanned - began, 2),
        "starts_per_second": round(n / (fanned - began)),
        "fan_in_seconds": round(ended - fanned, 2),
        "fan_in_per_second": round(n / (ended - fanned)),
        "parent_visits": parent.visits["FAN"],
    }


async def _scenarios(target: Target, args: argparse.Namespace) -> list[dict[str, Any]]:
    found = []
    if "transitions" in args.scenario:
        found.append(await transitions(target, args.instances, args.states))
        print(json.dumps(found[-1]), flush=True)
    if "waiting" in args.scenario:
        found.append(await waiting(target, args.waiting, args.poll, args.window))
        print(json.dumps(found[-1]), flush=True)
    if "children" in args.scenario:
        found.append(await children(target, args.children))
        print(json.dumps(found[-1]), flush=True)
    return found


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for backend in args.backend:
        target = Target(backend, args.dsn)
        try:
            results += await _scenarios(target, args)
        finally:
            await target.drop()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", action="append", choices=["postgres", "sqlite"])
    parser.add_argument("--dsn", default=os.environ.get("EVENTBUS_TEST_DSN", PG_DSN))
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--states", type=int, default=10)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--scenario", action="append", choices=["transitions", "waiting", "children"])
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    args.backend = args.backend or ["postgres", "sqlite"]
    args.scenario = args.scenario or ["transitions", "waiting", "children"]
    found = anyio.run(main, args)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(found, f, indent=2)
