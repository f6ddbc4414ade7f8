"""The dashboard in a real browser: Debian's chromium driven by Playwright, against ``eventbus dashboard``.

Each test starts the dashboard command on a free port over the seeded
database and saves a screenshot of what it looked at under tests/_output/.
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from eventbus import Bus
from eventbus.types import DeliveryFilter

from ...support.processes import ProcessGroup
from ._data import drain_orders, pay, state
from .conftest import OPERATOR, TOKEN

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
OUTPUT = Path(__file__).resolve().parents[2] / "_output"
EVENTBUS = str(Path(sys.executable).with_name("eventbus"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(group: ProcessGroup, env: dict[str, str], token: str | None) -> str:
    port = _free_port()
    cmd = [EVENTBUS, "dashboard", "tests.apps.web_app:bus", "--port", str(port)]
    proc = group.spawn(cmd + (["--token", token] if token else []), env, "dashboard")
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        with anyio.fail_after(15):
            while True:
                assert proc.alive(), proc.output()
                try:
                    if (await client.get(url + "/static/dashboard.js")).status_code == 200:
                        return url
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)


@contextlib.asynccontextmanager
async def _chromium() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), "install chromium: apt-get install -y chromium"
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def browser(serve) -> AsyncIterator[Browser]:
    """Closed before the dashboard stops, so its open event streams end first."""
    async with _chromium() as b:
        yield b


@pytest.fixture
async def serve(target, seeded: Bus, tmp_path: Path) -> AsyncIterator:
    group = ProcessGroup(tmp_path)

    async def start(token: str | None) -> str:
        return await _serve(group, target.env(), token)

    yield start
    await group.aclose()


async def _shot(page: Page, name: str, kind: str) -> None:
    OUTPUT.mkdir(exist_ok=True)
    await page.screenshot(path=str(OUTPUT / f"{name}-{kind}.png"), full_page=True)


async def test_every_page_loads(browser: Browser, serve, seeded: Bus, backend_kind: str) -> None:
    base = await serve(None)
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # A script or style the security policy blocked shows as a console error.
    page.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    (dead, *_) = await seeded.find_deliveries(DeliveryFilter(status="dead"))
    pages = {
        "overview": ("/", "Subscriptions"),
        "deliveries": ("/deliveries?subscription=charge", "matching"),
        "event": (f"/events/{dead.event_id}", "Causation chain"),
        "dead": ("/dead", "dead letters match"),
        "machines": ("/machines", "pay"),
        "machine": ("/machines/pay", "stateDiagram"),
        "instance": ("/machines/pay/instances/c-1", "waiting_approval"),
        "schedules": ("/schedules", "hourly-report"),
        "schedule": ("/schedules/hourly-report", "Recent occurrences"),
    }
    for name, (path, text) in pages.items():
        response = await page.goto(base + path)
        assert response is not None and response.ok, path
        await expect(page.locator("main")).to_contain_text(text)
        await _shot(page, name, backend_kind)
    assert errors == []
    await expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    # The refresh stamp is UTC, as every time on the page: 04:05:06, not the browser's 4:05:06 AM.
    await expect(page.locator("#live-stamp")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))


async def test_live_panel_refreshes_without_a_reload(browser: Browser, serve, seeded: Bus) -> None:
    base = await serve(None)
    page = await browser.new_page()
    await page.goto(base + "/deliveries?subscription=charge&status=dead")
    await expect(page.locator("#count")).to_have_text("3")
    await page.evaluate("window.__kept = true")  # gone if the page reloaded
    (first, *_) = [d.id for d in await seeded.find_deliveries(DeliveryFilter(status="dead"))]
    await seeded.purge(DeliveryFilter(status="dead", ids=[first]))
    await expect(page.locator("#count")).to_have_text("2", timeout=10_000)
    assert await page.evaluate("window.__kept === true")


async def test_replay_through_the_ui(browser: Browser, serve, seeded: Bus, backend_kind: str) -> None:
    base = await serve(TOKEN)
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    await page.goto(base + "/dead?subscription=charge")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    await expect(page.locator(".flash")).to_contain_text("actions unlocked")
    await page.goto(base + "/dead?subscription=charge")
    await page.click("text=Replay all matching…")
    await expect(page.locator("#preview-count")).to_have_text("3")
    await _shot(page, "confirm", backend_kind)
    await page.click("text=Yes, replay")
    await expect(page.locator(".flash")).to_contain_text("replay: 3 dead letter(s)")
    assert await seeded.count_deliveries(DeliveryFilter(status="dead")) == 0
    await page.click("nav >> text=Audit")  # the action is in the audit trail, with who, where and how many
    row = page.locator("#audit tbody tr").first
    await expect(row).to_contain_text("all matching subscription=charge")
    await expect(row).to_contain_text(OPERATOR)
    await expect(row.locator("td").nth(8)).to_have_text("3")
    await _shot(page, "audit", backend_kind)
    state["broken"] = False
    await drain_orders(seeded)
    assert await seeded.count_deliveries(DeliveryFilter(subscription="notify", status="completed")) == 6


async def test_approval_through_the_ui(browser: Browser, serve, seeded: Bus) -> None:
    base = await serve(TOKEN)
    page = await browser.new_page()
    await page.goto(base + "/machines/pay/instances/c-1")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    await page.goto(base + "/machines/pay/instances/c-1")
    await page.fill("input[aria-label=reason]", "ok by me")
    await page.click("button:text('Approve')")
    await expect(page.locator(".flash")).to_contain_text("approved")
    (row,) = await seeded.workflows.approvals(pay, "c-1")
    assert row.status == "approved" and row.reason == "ok by me" and row.decided_by == OPERATOR


async def test_pages_fit_a_phone_screen(browser: Browser, serve, seeded: Bus, backend_kind: str) -> None:
    """At 390 px wide the page never scrolls sideways: wide tables scroll inside their cards."""
    base = await serve(TOKEN)
    page = await browser.new_page(viewport={"width": 390, "height": 844})
    (dead, *_) = await seeded.find_deliveries(DeliveryFilter(status="dead"))
    await page.goto(base + "/")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    await expect(page.locator("#operator")).to_have_text(OPERATOR)
    event = f"/events/{dead.event_id}"
    for path in ["/", "/deliveries", "/dead", event, "/machines/pay/instances/c-1", "/schedules", "/charts"]:
        await page.goto(base + path)
        sizes = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        await _shot(page, "phone" + path.replace("/", "-").rstrip("-"), backend_kind)
        assert sizes[0] <= sizes[1], (path, sizes)


async def test_charts_in_the_browser(browser: Browser, serve, seeded: Bus, backend_kind: str) -> None:
    """The four charts and the handler table; the day's window, then one subscription's."""
    base = await serve(None)
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(base + "/")
    await page.click("nav >> text=Charts")
    await expect(page.locator("figure.chart svg[role=img]")).to_have_count(4)
    await expect(page.locator("#chart-runs rect.s-dead").first).to_be_visible()
    await expect(page.locator("#chart-runs .legend")).to_contain_text("dead-lettered")
    await expect(page.locator("#handlers tbody tr", has_text="charge").locator("td").nth(5)).to_have_text("3")
    await _shot(page, "charts", backend_kind)
    await page.click(".window-switch >> text=1d")
    await expect(page.locator("#chart-runs figcaption")).to_contain_text("Handler runs per 10 minutes")
    await page.select_option("select[name=subscription]", "charge")
    await page.click("button:text('Show')")
    await expect(page.locator("h2.scope")).to_have_text("charge · last day")
    await expect(page.locator("#handlers tbody tr")).to_have_count(1)
    assert "window=1d" in page.url and errors == []


async def test_lock_in_the_browser(browser: Browser, serve, seeded: Bus) -> None:
    base = await serve(TOKEN)
    page = await browser.new_page()
    await page.goto(base + "/dead")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    await page.goto(base + "/dead")
    await expect(page.locator("text=Purge all matching…")).to_have_count(1)
    assert TOKEN not in await page.content()
    await page.click("button:text('Lock')")
    await expect(page.locator(".flash")).to_contain_text("locked")
    await page.goto(base + "/dead")
    await expect(page.locator("text=Purge all matching…")).to_have_count(0)
    await expect(page.locator("input[name=token]")).to_have_count(1)


async def test_read_only_in_the_browser(browser: Browser, serve, seeded: Bus) -> None:
    base = await serve(None)
    page = await browser.new_page()
    await page.goto(base + "/dead")
    await expect(page.locator("header .mode")).to_contain_text("read-only")
    assert await page.locator("text=Replay all matching…").count() == 0
    assert await page.locator("input[name=ids]").count() == 0
    status = await page.evaluate(
        """async () => (await fetch('/dead/action', {method: 'POST',
             headers: {'Content-Type': 'application/x-www-form-urlencoded'},
             body: 'op=purge&scope=filter&confirm=yes&token="""
        + TOKEN
        + """'})).status"""
    )
    assert status == 403
    assert await seeded.count_deliveries(DeliveryFilter(status="dead")) == 3


async def test_example_application_screenshots(tmp_path: Path) -> None:
    """The README's pictures: the example application's order flow (SQLite), with declined cards."""
    from schemas import OrderPlaced as ExampleOrder
    from tests.apps.web_example import build

    from ...support.helpers import drain

    dsn = f"sqlite:///{tmp_path / 'example.db'}"
    bus = build(dsn)
    await bus.migrate()
    amounts = [1_250, 4_999, 72_000, 18_500, 3_300, 99_900, 640, 27_000]
    await bus.publish_many(
        ExampleOrder(order_id=f"ord-{1000 + i}", customer=f"cust-{i % 3}", amount_cents=a)
        for i, a in enumerate(amounts)
    )
    await drain(bus)
    group = ProcessGroup(tmp_path)
    try:
        port = _free_port()
        cmd = [EVENTBUS, "dashboard", "tests.apps.web_example:bus", "--port", str(port)]
        group.spawn(cmd, {"EVENTBUS_DSN": dsn}, "dashboard")
        base = f"http://127.0.0.1:{port}"
        async with _chromium() as browser:
            await _example_pages(browser, bus, base)
    finally:
        await bus.aclose()
        await group.aclose()


async def _example_pages(browser: Browser, bus: Bus, base: str) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 720})
    with anyio.fail_after(15):
        while True:
            try:
                await page.goto(base + "/")
                break
            except Exception:
                await anyio.sleep(0.1)
    await expect(page.locator("main")).to_contain_text("payments.capture")
    await _shot(page, "example", "overview")
    (shipped, *_) = await bus.find_deliveries(DeliveryFilter(subscription="shipping.notify-customer"))
    await page.goto(f"{base}/events/{shipped.event_id}")
    await expect(page.locator("#chain li")).to_have_count(4)
    await _shot(page, "example", "event")
    await page.goto(base + "/dead")
    await expect(page.locator("#count")).to_have_text("2")


@pytest.mark.parametrize("backend_kind", ["sqlite"], indirect=True)  # both backends: test_triage.py
async def test_triage_through_the_ui(browser: Browser, serve, seeded: Bus, backend_kind: str) -> None:
    base = await serve(TOKEN)
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    await page.goto(base + "/triage")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    await page.goto(base + "/triage")
    await expect(page.locator("#groups td.count")).to_have_text(["3"])
    await _shot(page, "triage", backend_kind)
    await page.click("#groups a.cause")
    await expect(page.locator("pre.traceback").first).to_contain_text("RuntimeError: card declined")
    await page.go_back()
    await page.click("#groups button:text('purge…')")
    await expect(page.locator("#preview-count")).to_have_text("3")
    await page.click("text=Yes, purge")
    await expect(page.locator(".flash")).to_contain_text("purge: 3 dead letter(s)")
    assert await seeded.count_deliveries(DeliveryFilter(status="dead")) == 0
