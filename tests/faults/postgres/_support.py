"""Helpers of the fault-injection suite: real worker processes, real signals.

Every process is started through :class:`Procs`, which a test closes in a
``finally`` block (or through the ``procs`` fixture): SIGTERM, then SIGKILL
after a short wait, and only for the processes it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from ...conftest import Target
from ...support.cli import run_cli
from ...support.processes import EVENTBUS, ROOT, Proc, ProcessGroup

APP = "tests.apps.fault_app:bus"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def prepare(target: Target) -> None:
    """Migrate the test's schema and add the tables the checks read.

    ``handler_runs`` is written by the app's handlers; ``transitions`` by a
    trigger on every status change of a delivery (with the database clock), so
    completions, reclaims and recoveries can be counted and timed afterwards.
    """
    bus = target.bus()
    try:
        await bus.migrate()
    finally:
        await bus.aclose()
    s = f'"{target.schema}"'
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(f"""
            CREATE TABLE {s}.handler_runs (
                id bigserial PRIMARY KEY, event_id bigint NOT NULL,
                delivery_id bigint NOT NULL, subscription text NOT NULL,
                pid integer NOT NULL, attempt integer NOT NULL, phase text NOT NULL,
                at timestamptz NOT NULL DEFAULT clock_timestamp());
            CREATE TABLE {s}.transitions (
                id bigserial PRIMARY KEY, delivery_id bigint NOT NULL, old_status text,
                new_status text NOT NULL, worker_id uuid, lease_token uuid,
                at timestamptz NOT NULL DEFAULT clock_timestamp());
            CREATE FUNCTION {s}.log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {s}.transitions (delivery_id, old_status, new_status, worker_id,
                                             lease_token)
                VALUES (NEW.id, OLD.status, NEW.status, NEW.worker_id, NEW.lease_token);
                RETURN NULL;
            END $$;
            CREATE TRIGGER deliveries_transitions AFTER UPDATE OF status ON {s}.deliveries
                FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
                EXECUTE FUNCTION {s}.log_transition();
        """)
    finally:
        await conn.close()


class Procs(ProcessGroup):
    """The processes one test started, against one PostgreSQL target."""

    def __init__(self, target: Target, logdir: Path) -> None:
        super().__init__(logdir)
        self.target = target

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return super().env({**self.target.env(), **(extra or {})})

    def worker(self, *args: str, env: dict[str, str] | None = None, name: str = "w") -> Proc:
        return self.spawn([EVENTBUS, "worker", APP, *args], env, name)

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return run_cli(args, self.env(env), cwd=ROOT, timeout=timeout)

    def status_json(self) -> dict[str, Any]:
        result = self.cli("status", "--json")
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))


async def wait_until(
    check: Callable[[], Awaitable[Any]],
    timeout: float,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def worker_id_of(conn: asyncpg.Connection, schema: str, pid: int, timeout: float = 15) -> Any:
    """The worker id a process registered in the workers table (its first heartbeat)."""

    async def find() -> Any:
        return await conn.fetchval(
            f'SELECT id FROM "{schema}".workers WHERE pid = $1 ORDER BY started_at DESC LIMIT 1',
            pid,
        )

    return await wait_until(find, timeout, what=f"worker row of pid {pid}")


async def status_counts(conn: asyncpg.Connection, schema: str) -> dict[str, int]:
    rows = await conn.fetch(f'SELECT status, count(*) AS n FROM "{schema}".deliveries GROUP BY 1')
    return {r["status"]: r["n"] for r in rows}


async def settled(conn: asyncpg.Connection, schema: str) -> bool:
    """No delivery pending or processing."""
    n = await conn.fetchval(
        f"SELECT count(*) FROM \"{schema}\".deliveries WHERE status IN ('pending', 'processing')"
    )
    return bool(n == 0)


async def drained(conn: asyncpg.Connection, schema: str, what: str, stall: float = 15.0) -> None:
    """Until no delivery is pending or processing; fails once none has ended for ``stall`` seconds.

    Judged by progress, not by a deadline: a busy machine drains slower, a stuck
    delivery (a lease never recovered, a claim never released) stops the count.
    Progress is a delivery reaching an end (completed, dead or cancelled), not
    the unfinished count going down: a completion that publishes follow-ups or
    starts runs adds as many unfinished deliveries as it ends, or more.
    """
    ended, since = -1, time.monotonic()
    while True:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status IN ('pending', 'processing')), "
            f"count(*) FILTER (WHERE status NOT IN ('pending', 'processing')) FROM \"{schema}\".deliveries"
        )
        assert row is not None
        left, now_ended = row
        if not left:
            return
        if now_ended > ended:
            ended, since = now_ended, time.monotonic()
        if time.monotonic() - since > stall:
            raise AssertionError(f"{what}: no delivery ended for {stall:.0f}s, {left} left")
        await asyncio.sleep(0.2)


def socket_ports_of(pid: int) -> set[int]:
    """Local TCP ports of the sockets a process holds (from /proc, no psutil)."""
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
