"""Health probes of a worker: liveness and readiness, in process and from the command line."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import anyio
import httpx
import pytest

from eventbus import Context, Worker
from eventbus.worker import serve_health

from ...conftest import Target
from ...support.helpers import OrderPlaced


async def _get(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


async def _until(check, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not await check():
            await anyio.sleep(0.05)


async def test_probes_follow_a_worker_from_serving_through_draining_to_stopped(bus) -> None:
    started, release = anyio.Event(), anyio.Event()

    @bus.subscribe(OrderPlaced, name="slow")
    async def slow(event: OrderPlaced, ctx: Context) -> None:
        started.set()
        await release.wait()

    await bus.register()
    worker = Worker(bus, poll_interval_seconds=0.5, grace_seconds=30)
    assert not worker.health().ready and worker.health().phase == "starting"
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_health, worker, "127.0.0.1", 0)
        tg.start_soon(worker.run)

        async def ready() -> bool:
            return (await _get(port, "/readyz")).status_code == 200

        await _until(ready)
        body = (await _get(port, "/readyz")).json()
        assert body["worker_id"] == worker.id and body["phase"] == "serving"
        assert set(body["checks"].values()) == {"ok"}
        assert (await _get(port, "/livez")).status_code == 200
        assert (await _get(port, "/healthz")).status_code == 200
        missing = await _get(port, "/metrics")
        assert missing.status_code == 404 and "/livez" in missing.text

        await bus.publish(OrderPlaced(order_id="o-1"))
        with anyio.fail_after(30):
            await started.wait()
        worker.stop()  # draining: the running handler has its grace period
        draining = await _get(port, "/readyz")
        assert draining.status_code == 503
        assert draining.json()["checks"]["serving"] == "worker is stopping"
        assert (await _get(port, "/livez")).status_code == 200  # draining is not dead

        release.set()
        with anyio.fail_after(30):
            while worker.phase != "stopped":
                await anyio.sleep(0.05)
        gone = await _get(port, "/livez")
        assert gone.status_code == 503 and gone.json()["checks"]["running"] == "the worker's run has ended"
        tg.cancel_scope.cancel()


def test_worker_command_serves_health_probes(target: Target) -> None:
    env = target.env()
    subprocess.run([sys.executable, "-m", "eventbus", "migrate"], env=env, check=True, capture_output=True)
    cmd = [sys.executable, "-m", "eventbus", "worker", "tests.apps.cli_app:bus", "--health-port", "0"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            found = re.search(r"health probes on http://127\.0\.0\.1:(\d+)/livez", line)
            if found:
                port = int(found.group(1))
                break
        assert port is not None
        deadline, status = time.monotonic() + 30, 0
        while time.monotonic() < deadline and status != 200:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


@pytest.mark.parametrize("flag", ["--health-port", "--metrics-port"])
def test_a_probe_port_in_use_is_one_line(target: Target, flag: str) -> None:
    env = target.env()
    subprocess.run([sys.executable, "-m", "eventbus", "migrate"], env=env, check=True, capture_output=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "eventbus", "worker", "tests.apps.cli_app:bus", flag, str(port)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    what = "health probes" if flag == "--health-port" else "metrics"
    assert f"Error: cannot serve {what} on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr
