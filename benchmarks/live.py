"""The dashboard's live updates: open pages against one dashboard process, and what they cost.

    python -m benchmarks.live --dsn postgresql://postgres@127.0.0.1:5432/bench_live --streams 50 \
        --json benchmarks/results/live_postgres.json
    python -m benchmarks.live --dsn sqlite:////tmp/bench_live.db --streams 50

Serves the dashboard over HTTP (uvicorn, in this process), opens ``--streams``
event streams (``/live``), then publishes ``--publishes`` events one by one
from another bus, ``--gap`` seconds apart. It reports how long after each
publish every stream said ``refresh`` (median, 95th percentile, worst), how
many status looks the dashboard made in all (a look is what each page made
every second before the streams shared one watcher), and on PostgreSQL how
many connections of the dashboard were listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import uvicorn

from eventbus import Bus, Event
from eventbus.web import create_app


class LiveTick(Event, event_type="bench.live_tick"):
    i: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _listening(dsn: str) -> int | None:
    if not dsn.startswith("postgres"):
        return None
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        sql = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
        )
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def run(dsn: str, streams: int, publishes: int, gap: float) -> dict[str, Any]:
    bus, other = Bus(dsn, migrate=True), Bus(dsn)
    await bus.migrate()
    looks = 0
    status = bus.status

    async def counted() -> Any:
        nonlocal looks
        looks += 1
        return await status()

    bus.status = counted  # type: ignore[method-assign]
    port = _free_port()
    app = create_app(bus, live_interval=0.2)
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off"))
    sent: list[float] = []
    heard: list[list[float]] = [[] for _ in range(streams)]
    opened = anyio.Event()
    open_count = 0

    async def stream(n: int, client: httpx.AsyncClient) -> None:
        nonlocal open_count
        async with client.stream("GET", f"http://127.0.0.1:{port}/live?max_seconds=300") as r:
            lines = r.aiter_lines()
            await anext(lines)  # retry:
            open_count += 1
            if open_count == streams:
                opened.set()
            async for line in lines:
                if line == "event: refresh" and sent:
                    heard[n].append(time.monotonic() - sent[-1])

    async with anyio.create_task_group() as tg, other:
        tg.start_soon(server.serve)
        while not server.started:  # noqa: ASYNC110 (uvicorn offers no event to wait on)
            await anyio.sleep(0.05)
        limits = httpx.Limits(max_connections=streams + 5)
        async with httpx.AsyncClient(limits=limits, timeout=None) as client:
            for n in range(streams):
                tg.start_soon(stream, n, client)
            with anyio.fail_after(30):
                await opened.wait()
            await anyio.sleep(1.0)
            listening = await _listening(dsn)
            looks_before, started = looks, time.monotonic()
            for i in range(publishes):
                sent.append(time.monotonic())
                await other.publish(LiveTick(i=i))
                await anyio.sleep(gap)
            elapsed = time.monotonic() - started
            looks_during = looks - looks_before
            server.should_exit = True
            tg.cancel_scope.cancel()
    await bus.aclose()
    latencies = sorted(x for per in heard for x in per)
    return {
        "backend": dsn.split(":", 1)[0],
        "streams": streams,
        "publishes": publishes,
        "gap_seconds": gap,
        "refreshes_heard": len(latencies),
        "refresh_after_publish_ms": {
            "median": round(statistics.median(latencies) * 1000, 1),
            "p95": round(latencies[int(len(latencies) * 0.95) - 1] * 1000, 1),
            "max": round(latencies[-1] * 1000, 1),
        },
        "status_looks": looks_during,
        "status_looks_per_minute": round(looks_during * 60 / elapsed, 1),
        "status_looks_per_minute_one_per_page_each_second": streams * 60,
        "listen_connections_on_the_server": listening,
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--publishes", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(run(args.dsn, args.streams, args.publishes, args.gap))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
