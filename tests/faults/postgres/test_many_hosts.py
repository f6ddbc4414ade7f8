"""Workers on three hosts, one of them cut off mid-run; clocks that disagree.

Each host is a network namespace of the test's own (``tests/support/netns.py``,
needs root: CI runs as root) reaching a throwaway PostgreSQL over its own veth
pair, under its own host name, with its wall clock ``SKEW`` seconds off in
either direction (``tests/apps/skewed_clock``). They share an ordered
subscription (``tests/apps/ordered_app``). Mid-run, host 3's link goes down
while it runs a slow delivery: nothing it holds can be completed or renewed,
its leases expire by the database's clock, and the other hosts take the work
over. Every key's deliveries still complete in order, and no two of a key's
deliveries ever run at once, across hosts.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from pathlib import Path

import anyio
import asyncpg

from eventbus import Bus, Envelope

from ...apps.ordered_app import Step, read_records, router
from ...support.netns import Hosts
from ...support.pgserver import PgServer
from ...support.processes import EVENTBUS, ROOT, ProcessGroup

SKEW = {1: 0.0, 2: 3.0, 3: -3.0}
"""Seconds each host's wall clock is off; leases and recovery must not care."""
KEYS, PER_KEY, SLOW_SEQ = 30, 12, 6


def _collapsed(seqs: list[int]) -> list[int]:
    """A key's done sequence with repeats of one delivery (a run on the cut host, then its rerun) as one."""
    return [s for i, s in enumerate(seqs) if i == 0 or seqs[i - 1] != s]


async def test_workers_on_three_hosts_one_cut_off(tmp_path: Path) -> None:
    hosts = Hosts(3)
    server: PgServer | None = None
    procs = ProcessGroup(tmp_path)
    try:
        await asyncio.to_thread(hosts.create)
        listen = ("127.0.0.1", *(hosts.gateway(i) for i in SKEW))
        server = await asyncio.to_thread(lambda: PgServer(listen).start(trust=(hosts.cidr,)))
        schema = "many_hosts"
        bus = Bus(server.dsn, schema=schema)
        bus.include(router)
        await bus.migrate()
        await bus.register()
        records = tmp_path / "records"
        pids: dict[int, int] = {}
        for i, skew in SKEW.items():
            dsn = f"postgresql://postgres@{hosts.gateway(i)}:{server.port}/postgres"
            env = {
                "EVENTBUS_DSN": dsn,
                "EVENTBUS_SCHEMA": schema,
                "ORD_RECORDS": str(records),
                "ORD_LEASE": "2",
                "ORD_JITTER_MS": "20",
                "ORD_SLOW_SEQ": str(SLOW_SEQ),
                "ORD_SLOW_SECONDS": "1.0",
                "EVENTBUS_TEST_CLOCK_SKEW": str(skew),
                "PYTHONPATH": f"{ROOT / 'tests' / 'apps' / 'skewed_clock'}:{ROOT}",
            }
            argv = [
                EVENTBUS,
                "worker",
                "tests.apps.ordered_app:bus",
                "--concurrency",
                "10",
                "--batch-size",
                "5",
            ]
            argv += ["--recovery-interval", "0.5"]
            pids[i] = procs.spawn(hosts.command(i, argv, f"host{i}"), env, f"host{i}").pid

        db = await asyncpg.connect(server.dsn)
        try:
            with anyio.fail_after(60):
                while await db.fetchval(f'SELECT count(DISTINCT hostname) FROM "{schema}".workers') < 3:
                    await anyio.sleep(0.1)
            names = {
                r["pid"]: r["hostname"]
                for r in await db.fetch(f'SELECT pid, hostname FROM "{schema}".workers')
            }
            assert names == {pids[i]: f"host{i}" for i in SKEW}  # one worker per host, under its own name

            await bus.publish_many(
                Envelope(Step(key=f"k{k}", seq=s), ordering_key=f"k{k}")
                for s in range(PER_KEY)
                for k in range(KEYS)
            )

            def slow_on_host3() -> bool:  # host 3 is inside a slow first attempt
                runs = read_records(str(records))
                started = {
                    (r[1], r[2]) for r in runs if r[0] == "start" and r[4] == pids[3] and r[2] == SLOW_SEQ
                }
                ended = {(r[1], r[2]) for r in runs if r[0] == "done" and r[4] == pids[3]}
                return bool(started - ended)

            with anyio.fail_after(90):
                while not slow_on_host3():
                    await anyio.sleep(0.02)
            await asyncio.to_thread(hosts.cut, 3)
            cut_at = time.monotonic()

            total = KEYS * PER_KEY
            with anyio.fail_after(120):
                while (
                    await db.fetchval(
                        f"SELECT count(*) FROM \"{schema}\".deliveries WHERE status = 'completed'"
                    )
                    < total
                ):
                    await anyio.sleep(0.2)
            drained_after_cut = time.monotonic() - cut_at
        finally:
            await db.close()
        await bus.aclose()

        runs = read_records(str(records))
        done: dict[str, list[int]] = defaultdict(list)
        phases: dict[str, list[str]] = defaultdict(list)
        for phase, key, seq, _attempt, _pid in runs:
            phases[key].append(phase)
            if phase == "done":
                done[key].append(seq)
        assert {k: _collapsed(v) for k, v in done.items()} == {
            f"k{k}": list(range(PER_KEY)) for k in range(KEYS)
        }
        for key, seen in phases.items():  # never two of a key's deliveries at once, on any hosts
            assert seen == ["start", "done"] * (len(seen) // 2), key
        by_host = {i: sum(1 for r in runs if r[0] == "done" and r[4] == pids[i]) for i in SKEW}
        assert all(by_host.values()), by_host  # every host took part
        cut_runs = {(r[1], r[2]) for r in runs if r[0] == "start" and r[4] == pids[3]}
        moved = {(r[1], r[2]) for r in runs if r[0] == "start" and r[4] != pids[3] and r[3] > 1} & cut_runs
        assert moved, "nothing host 3 held moved to another host"
        attempts = Counter(r[3] for r in runs if r[0] == "start")
        print(
            f"\nthree hosts (clock skew {SKEW}): runs done per host {by_host}; host 3 cut off holding "
            f"work, {len(moved)} of its deliveries moved and ran again elsewhere; attempts {dict(attempts)}; "
            f"all {KEYS * PER_KEY} completed {drained_after_cut:.1f}s after the cut"
        )
    finally:
        await procs.aclose()
        if server is not None:
            await asyncio.to_thread(server.destroy)
        await asyncio.to_thread(hosts.remove)
