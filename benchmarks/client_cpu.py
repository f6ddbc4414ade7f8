"""Client CPU per delivery: what the worker's own process spends, not the database.

    git archive main eventbus migrations | tar -x -C /tmp/before     # the code to compare with
    python -m benchmarks.client_cpu --dsn sqlite --dsn postgresql://postgres@127.0.0.1:5432/test \\
        --n 20000 --runs 5 --compare /tmp/before --json benchmarks/results/client_cpu.json

Each measurement is a fresh process: ``--n`` events are published on a
temporary bus (one subscription, a no-op handler), then one burst worker
(concurrency 200, batch 100) drains them, and the CPU time spent during the
drain is divided by the deliveries: ``process`` (every thread of the process:
on SQLite that includes the database engine, which runs in the process's
aiosqlite thread) and ``loop`` (the event loop's thread only: the client's
Python, the same on both backends). CPU time does not count the time the
process waits for a core, so it holds up on a loaded machine far better than
a rate; the runs alternate between the two versions, and the medians are
reported. With ``--compare PATH`` (a checkout of another version: a folder
with its ``eventbus`` and ``migrations``) the same measurement runs with that code too. With ``--hook`` a
hook that counts outcomes is attached (the observed path). ``--dsn tracker``
times the observability tracker's own work per delivery alone (no database,
no handler), as a worker with nothing attached does it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from eventbus import Context, Envelope
from eventbus.observe import NoHooks
from eventbus.testing import BenchEvent, drain, temporary_bus

ROOT = Path(__file__).resolve().parent.parent


async def measure(dsn: str, n: int, hook: bool) -> dict[str, float]:
    """One drain of ``n`` deliveries in this process: CPU microseconds per delivery."""
    pool: dict[str, Any] = {} if dsn.startswith("sqlite") else {"max_pool_size": 8}
    async with temporary_bus(None if dsn == "sqlite" else dsn, **pool) as bus:
        if hook:
            bus.add_hooks(type("Counting", (NoHooks,), {"on_outcome": lambda self, o: None})())

        @bus.subscribe(BenchEvent, name="bench.cpu")
        async def handle(event: BenchEvent, ctx: Context) -> None:
            pass

        await bus.register()
        for start in range(0, n, 1000):
            await bus.publish_many(Envelope(BenchEvent(n=i)) for i in range(start, min(n, start + 1000)))
        await bus.backend.schema.analyze()
        process, loop, wall = time.process_time(), time.thread_time(), time.perf_counter()
        done = await drain(bus, wait_for_scheduled=False, concurrency=200, batch_size=100)
        process, loop = time.process_time() - process, time.thread_time() - loop
        wall = time.perf_counter() - wall
    assert done.processed == n, done
    return {"process_us": process / n * 1e6, "loop_us": loop / n * 1e6, "wall_per_second": n / wall}


def tracker_ns(batches: int = 200, repeats: int = 7) -> float:
    """The tracker's own work per delivery, in nanoseconds, as a worker with no hook attached
    does it (claim of a batch of 100, then per delivery: enter, exit and the written result);
    the least of ``repeats`` timings, which a loaded machine can only make longer."""
    from eventbus.backends.base import ClaimedDelivery, Completion
    from eventbus.logs import OutcomeLog
    from eventbus.observe import CompositeHooks, DeliveryTracker

    now = datetime.now(UTC)
    batch = [
        ClaimedDelivery(i, i, 1, 1, "t", "bench.tick", b"{}", {}, None, None, None, now) for i in range(100)
    ]
    contexts = [Context(d, "bench", lambda *a, **k: None) for d in batch]
    done = [Completion(d.id, d.lease_token) for d in batch]
    accepted = {(d.id, d.lease_token) for d in batch}
    tracker = DeliveryTracker(CompositeHooks([OutcomeLog()]), "worker")
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for _ in range(batches):
            tracker.claimed("bench", batch, 0.001)
            for ctx in contexts:
                tracker.exit(ctx, tracker.enter(ctx), None)
            tracker.written(done, accepted)
        best = min(best, (time.perf_counter_ns() - started) / (batches * len(batch)))
    return best


def _child(dsn: str, n: int, hook: bool, code: Path | None) -> dict[str, float]:
    """Measure in a fresh process, importing ``eventbus`` from ``code`` when given."""
    path = [str(code)] if code else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    args = [sys.executable, "-m", "benchmarks.client_cpu", "--child", "--dsn", dsn, "--n", str(n)]
    with tempfile.TemporaryDirectory() as cwd:  # so the current folder does not shadow PYTHONPATH
        out = subprocess.run(
            [*args, *(["--hook"] if hook else [])],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        )
    return dict(json.loads(out.stdout.splitlines()[-1]))


def compare(dsn: str, n: int, runs: int, hook: bool, before: Path | None) -> dict[str, Any]:
    """``runs`` measurements of each version, alternating which goes first; the medians."""
    versions: dict[str, Path | None] = {"current": None, **({"before": before} if before else {})}
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in versions}
    for r in range(runs):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for v in order:
            samples[v].append(_child(dsn, n, hook, versions[v]))
            print(dsn.split(":")[0], "hook" if hook else "no hook", v, samples[v][-1], flush=True)
    out: dict[str, Any] = {"backend": dsn.split(":")[0], "n": n, "runs": runs, "hook": hook}
    for v, got in samples.items():
        out[v] = {k: statistics.median(s[k] for s in got) for k in got[0]} | {"samples": got}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dsn",
        action="append",
        help="sqlite, a PostgreSQL DSN, or tracker (the tracker's own work alone); repeatable",
    )
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", type=Path, help="A folder with the eventbus package to compare with.")
    parser.add_argument("--hook", action="store_true", help="Attach a hook (the observed path).")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", dest="json_path")
    ns = parser.parse_args()
    dsns = ns.dsn or ["sqlite"]
    if ns.child:
        got = (
            {"tracker_ns": tracker_ns()}
            if dsns[0] == "tracker"
            else anyio.run(measure, dsns[0], ns.n, ns.hook)
        )
        print(json.dumps(got))
        sys.exit(0)
    results = [compare(d, ns.n, ns.runs, ns.hook, ns.compare) for d in dsns]
    for res in results:
        print({k: v for k, v in res.items() if k not in ("current", "before")})
        for v in ("before", "current"):
            if v in res:
                print(" ", v, {k: round(x, 1) for k, x in res[v].items() if k != "samples"})
    if ns.json_path:
        with open(ns.json_path, "w") as f:
            json.dump(results, f, indent=2)
