"""What the browser tests share: one Chromium per test process, and the dashboard served two ways.

Chromium (Debian's, driven by Playwright) starts once per test process (per
pytest-xdist worker); each test has contexts of its own in it (cookies and
storage apart), closed when it ends. The dashboard is served in the test's
process by uvicorn on a port of its own, over a bus of its own on the test's
database (as the command builds it); the tests that need the dashboard in a
process of its own start the real ``eventbus dashboard`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import uvicorn
from playwright.async_api import Browser, Page, async_playwright

from eventbus import Bus
from eventbus.cli.dashboard import allowed_hosts_for
from eventbus.web import create_app

from ...support.processes import ProcessGroup

__all__ = ["EVENTBUS", "OUTPUT", "chromium", "serve_app", "serve_command", "shot"]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
OUTPUT = Path(__file__).resolve().parents[2] / "_output"
EVENTBUS = str(Path(sys.executable).with_name("eventbus"))
HOST = "127.0.0.1"


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), "install chromium: apt-get install -y chromium"
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            await b.close()


async def shot(page: Page, name: str, kind: str) -> None:
    """Save what ``page`` shows under tests/_output/."""
    OUTPUT.mkdir(exist_ok=True)
    await page.screenshot(path=str(OUTPUT / f"{name}-{kind}.png"), full_page=True)


@contextlib.asynccontextmanager
async def serve_app(bus: Bus, token: str | None) -> AsyncIterator[str]:
    """Serve the dashboard of ``bus`` (closed at the end) from this process, as the command would; its URL."""
    app = create_app(bus, token, close_bus=True, allowed_hosts=allowed_hosts_for(HOST, ()))
    config = uvicorn.Config(
        app, log_config=None, log_level="warning", access_log=False, ws="none", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind((HOST, 0))
    url = f"http://{HOST}:{sock.getsockname()[1]}"
    # A task, not a task group: the test enters this and its fixture's teardown leaves it, in other tasks.
    serving = asyncio.create_task(server.serve([sock]))
    try:
        with anyio.fail_after(15):
            while not server.started:
                assert not serving.done(), serving
                await anyio.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        await serving
        sock.close()


async def serve_command(group: ProcessGroup, env: dict[str, str], token: str | None, *options: str) -> str:
    """Start ``eventbus dashboard`` on the test application and a free port; its URL once it answers."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = int(s.getsockname()[1])
    cmd = [EVENTBUS, "dashboard", "tests.apps.web_app:bus", "--port", str(port), *options]
    proc = group.spawn(cmd + (["--token", token] if token else []), env, "dashboard")
    url = f"http://{HOST}:{port}"
    async with httpx.AsyncClient() as client:
        with anyio.fail_after(15):
            while True:
                assert proc.alive(), proc.output()
                try:
                    if (await client.get(url + "/static/dashboard.js")).status_code == 200:
                        return url
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.05)
