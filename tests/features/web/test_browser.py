"""The dashboard in a real browser: Debian's chromium driven by Playwright.

The tests share their process's Chromium, each with contexts of its own, and
serve the dashboard over the seeded database from the test's process
(conftest.py, _browser.py); the one that needs it in a process of its own
starts the real ``eventbus dashboard`` command. Each saves a screenshot of what
it looked at under tests/_output/.

A browser test runs on one backend when its backend's part is covered on both
by the route tests (test_routes.py, test_live.py, test_triage.py, …).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import anyio
import pytest
from playwright.async_api import Browser, Page, expect

from eventbus import Bus
from eventbus.types import DeliveryFilter

from ...support.helpers import OrderPlaced
from ._browser import serve_app
from ._browser import shot as _shot
from ._data import drain_orders, pay, state
from .conftest import OPERATOR, TOKEN

ONE = pytest.mark.parametrize("backend_kind", ["sqlite"], indirect=True)
"""A browser test on one backend: what differs between the backends is covered by the route tests on both."""


def __getattr__(name: str) -> object:
    """The fixtures ``browser`` and ``serve`` (conftest.py), still importable from here as they were."""
    if name in ("browser", "serve"):
        from . import conftest

        return getattr(conftest, name)
    raise AttributeError(name)


@ONE  # both backends: test_routes.py (every page), test_live.py (the stream)
async def test_every_page_loads(page: Page, serve, seeded: Bus, backend_kind: str) -> None:
    base = await serve(None)
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
        "machine": ("/machines/pay", "stateDiagram"),  # the source, behind its disclosure
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
    # The refresh stamp is local time as every time on the page, 24-hour: 16:05:06, not 4:05:06 PM.
    await expect(page.locator("#live-stamp")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))


@ONE  # both backends: test_routes.py (a count change refreshes the stream), test_live.py
async def test_live_panel_refreshes_without_a_reload(page: Page, serve, seeded: Bus) -> None:
    base = await serve(None)
    await page.goto(base + "/deliveries?subscription=charge&status=dead")
    await expect(page.locator("#count")).to_have_text("3")
    await page.evaluate("window.__kept = true")  # gone if the page reloaded
    (first, *_) = [d.id for d in await seeded.find_deliveries(DeliveryFilter(status="dead"))]
    await seeded.purge(DeliveryFilter(status="dead", ids=[first]))
    await expect(page.locator("#count")).to_have_text("2", timeout=10_000)
    assert await page.evaluate("window.__kept === true")


@ONE  # both backends: test_routes.py (bulk replay), test_audit.py
async def test_replay_through_the_ui(page: Page, serve, seeded: Bus, backend_kind: str) -> None:
    base = await serve(TOKEN)
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


@ONE  # both backends: test_routes.py (approval through the dashboard)
async def test_approval_through_the_ui(page: Page, serve, seeded: Bus) -> None:
    base = await serve(TOKEN)
    await page.goto(base + "/machines/pay/instances/c-1")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    # the unlock's answer sets the cookie the approval form needs: wait for it, as the other walks do
    await expect(page.locator(".flash")).to_contain_text("actions unlocked")
    await page.goto(base + "/machines/pay/instances/c-1")
    await page.fill("input[aria-label=reason]", "ok by me")
    await page.click("button:text('Approve')")
    await expect(page.locator(".flash")).to_contain_text("approved")
    (row,) = await seeded.workflows.approvals(pay, "c-1")
    assert row.status == "approved" and row.reason == "ok by me" and row.decided_by == OPERATOR


async def _every_page(page: Page, base: str, bus: Bus) -> AsyncIterator[str]:
    """Go to each page of the dashboard in turn (actions unlocked), yielding its name once it shows.

    With the pages of a flash message, a confirmation (with its warning) and an error.
    """
    (dead, *_) = await bus.find_deliveries(DeliveryFilter(status="dead"))
    await page.goto(base + "/")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    await expect(page.locator(".flash")).to_contain_text("actions unlocked")
    yield "flash"
    paths = {
        "overview": "/",
        "deliveries": "/deliveries?subscription=charge",
        "dead": "/dead",
        "triage": "/triage",
        "traceback": f"/triage/deliveries/{dead.id}",
        "event": f"/events/{dead.event_id}",
        "machines": "/machines",
        "machine": "/machines/pay",
        "instance": "/machines/pay/instances/c-1",
        "schedules": "/schedules",
        "schedule": "/schedules/hourly-report",
        "audit": "/audit",
        "charts": "/charts",
        "error": "/events/999999999",
    }
    for name, path in paths.items():
        await page.goto(base + path)
        await expect(page.locator("main h1")).to_be_visible()
        yield name
    await page.goto(base + "/dead")
    await page.click("text=Purge all matching…")
    await expect(page.locator("#preview-count")).to_have_text("3")
    yield "confirm"


@ONE  # the pages look the same on both
async def test_pages_fit_a_phone_screen(browser: Browser, serve, seeded: Bus, backend_kind: str) -> None:
    """At 390 px wide no page scrolls sideways, in either colour scheme: wide tables scroll in their cards."""
    base = await serve(TOKEN)
    page = await browser.new_page(viewport={"width": 390, "height": 844})
    async for name in _every_page(page, base, seeded):
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            sizes = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            if name in ("overview", "event", "confirm"):
                await _shot(page, f"phone-{scheme}-{name}", backend_kind)
            assert sizes[0] <= sizes[1], (scheme, name, sizes)


# The contrast (WCAG 2) of each text element against the first background behind it; the lowest found.
LOWEST_CONTRAST = """(selector) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const linear = (v) => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  const lum = ([r, g, b]) => 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
  const ground = (el) => {
    for (; el; el = el.parentElement) {
      const c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || c[3] > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  let worst = [99, ""];
  for (const el of document.querySelectorAll(selector)) {
    if (!el.offsetParent || !el.textContent.trim()) continue;
    const [a, b] = [lum(rgb(getComputedStyle(el).color)), lum(ground(el))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < worst[0]) worst = [ratio, el.outerHTML.slice(0, 120)];
  }
  return worst;
}"""
TEXT = "a, th, td, .status, .muted, pre, code, .flash, .error, button, label, select, input, h1, h2, p, li"


@ONE  # the pages look the same on both
async def test_dark_mode_follows_the_system_and_every_page_reads_in_both(
    page: Page, serve, seeded: Bus, backend_kind: str
) -> None:
    base = await serve(TOKEN)
    grounds = set()
    async for name in _every_page(page, base, seeded):
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            ratio, where = await page.evaluate(LOWEST_CONTRAST, TEXT)
            assert ratio >= 4.5, (scheme, name, round(ratio, 2), where)  # WCAG AA for body text
            if name in ("overview", "event", "dead", "confirm", "traceback", "flash"):
                await _shot(page, f"{scheme}-{name}", backend_kind)
            ground = await page.evaluate("getComputedStyle(document.body).backgroundColor")
            grounds.add((scheme, ground))
    assert grounds == {("light", "rgb(247, 248, 250)"), ("dark", "rgb(15, 19, 24)")}


@ONE  # both backends: test_routes.py, test_live.py (the refresh on a publish)
async def test_lists_by_keyboard(page: Page, serve, seeded: Bus, backend_kind: str) -> None:
    base = await serve(None)
    await page.goto(base + "/deliveries?subscription=charge")
    rows = page.locator("main table tbody tr")
    await expect(rows).to_have_count(6)
    focused = page.locator("tr.nav-focus")
    await page.keyboard.press("j")
    await expect(focused).to_have_count(1)
    assert await page.evaluate("document.activeElement === document.querySelector('main tbody tr')")
    await page.keyboard.press("j")
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("k")
    first_ids = await rows.locator("td.did").all_inner_texts()
    await expect(focused.locator("td.did")).to_have_text(first_ids[1])
    outline = await focused.evaluate("r => getComputedStyle(r).outlineStyle")
    assert outline == "solid"  # the focus is visible
    await _shot(page, "keyboard-row", backend_kind)
    await seeded.publish(OrderPlaced(order_id="while-reading"))  # a live refresh keeps the picked row
    await expect(page.locator("#count")).to_have_text("7")
    await expect(focused).to_have_count(1)
    assert await page.evaluate("document.activeElement.matches('tr.nav-focus')")
    event_link = await focused.locator("a[href]").first.get_attribute("href")  # what Enter opens
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(base + str(event_link))
    await page.go_back()
    await page.keyboard.press("/")  # the filter box takes the keys from here on
    assert await page.evaluate("document.activeElement.name") == "event_type"
    await page.keyboard.type("jk?")
    await expect(page.locator("input[name=event_type]")).to_have_value("jk?")
    await expect(focused).to_have_count(0)
    await expect(page.locator("#kbd-help")).to_have_count(0)
    await page.locator("input[name=event_type]").fill("")
    await page.keyboard.press("Tab")
    await page.evaluate("document.activeElement.blur()")
    await page.keyboard.press("?")
    await expect(page.locator("#kbd-help")).to_be_visible()
    await expect(page.locator("#kbd-help")).to_contain_text("next row")
    await _shot(page, "keyboard-help", backend_kind)
    await page.keyboard.press("Escape")
    await expect(page.locator("#kbd-help")).to_be_hidden()
    await page.keyboard.press("j")
    await page.keyboard.press("Tab")  # no trap: Tab leaves the row
    assert await page.evaluate("!document.activeElement.matches('tr')")
    await expect(focused).to_have_count(0)


@ONE  # the times are stored the same on both: test_hardening.py
async def test_times_show_in_the_browsers_time_zone_with_utc_on_hover(
    browser: Browser, serve, seeded: Bus
) -> None:
    base = await serve(None)
    context = await browser.new_context(timezone_id="Asia/Tokyo")
    page = await context.new_page()
    await page.goto(base + "/deliveries?subscription=charge")
    first = page.locator("main time[datetime]").first
    utc = datetime.fromisoformat((await first.get_attribute("datetime")) or "")
    tokyo = utc.astimezone(timezone(timedelta(hours=9))).strftime("%Y-%m-%d %H:%M:%S")
    await expect(first).to_have_text(tokyo)
    await expect(first).to_have_attribute("title", utc.strftime("%Y-%m-%d %H:%M:%S UTC"))
    await expect(page.locator("#time-zone")).to_contain_text("Asia/Tokyo")
    await context.close()


async def test_an_open_page_refreshes_on_a_publish_elsewhere_without_polling(
    browser: Browser, serve, seeded: Bus
) -> None:
    """With the status looks a minute apart, only a change hint (LISTEN, the file's commits) is this fast.

    On both backends, with the real ``eventbus dashboard`` command: the hint crosses processes.
    """
    base = await serve(None, "--live-fallback", "60")
    page = await browser.new_page()
    await page.goto(base + "/deliveries?subscription=charge")
    await expect(page.locator("#count")).to_have_text("6")
    await expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    await page.evaluate("window.__kept = true")  # gone if the page reloaded
    await anyio.sleep(0.5)  # the stream's own first refresh is over
    await seeded.publish(OrderPlaced(order_id="late"))  # this test's process, its own connection
    await expect(page.locator("#count")).to_have_text("7", timeout=2_500)
    assert await page.evaluate("window.__kept === true")


@ONE  # both backends: test_drawings.py, test_routes.py
async def test_machine_drawings_in_the_browser(page: Page, serve, seeded: Bus, backend_kind: str) -> None:
    """The drawn diagram and the run's timeline render, fit their cards, and their text does not overlap."""
    base = await serve(None)
    await page.goto(base + "/machines/pay")
    drawing = page.locator("figure.machine-drawing svg")
    await expect(drawing).to_be_visible()
    await expect(page.locator("details.diagram-source pre")).to_be_hidden()  # the source, one click away
    await page.click("details.diagram-source summary")
    await expect(page.locator("details.diagram-source pre")).to_contain_text("stateDiagram-v2")
    await _shot(page, "machine-drawing", backend_kind)
    await page.goto(base + "/machines/pay/instances/c-1")
    await expect(page.locator("figure.run-timeline svg")).to_be_visible()
    await expect(page.locator("table.timeline-table tbody tr")).to_have_count(1)
    await expect(page.locator("figure.machine-drawing g.current")).to_contain_text("CHARGE")
    await _shot(page, "instance-timeline", backend_kind)
    boxes = await page.evaluate(
        """() => [...document.querySelectorAll('figure svg text')].map(t => {
             const r = t.getBoundingClientRect(); return [t.textContent, r.x, r.y, r.width, r.height]; })"""
    )
    for i, (a, ax, ay, aw, ah) in enumerate(boxes):
        assert aw > 0 and ah > 0, a
        for b, bx, by, bw, bh in boxes[i + 1 :]:
            overlap = ax < bx + bw - 1 and bx < ax + aw - 1 and ay < by + bh - 1 and by < ay + ah - 1
            assert not overlap, (a, b)
    await page.click("figure.machine-drawing a >> text=CHARGE")  # a state's box leads to its runs
    await expect(page).to_have_url(re.compile(r"/machines/pay\?state=CHARGE$"))


@ONE  # both backends: test_charts.py
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


@ONE  # both backends: test_hardening.py (lock ends the session)
async def test_lock_in_the_browser(page: Page, serve, seeded: Bus) -> None:
    base = await serve(TOKEN)
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


@ONE  # both backends: test_routes.py (read-only refuses every action)
async def test_read_only_in_the_browser(page: Page, serve, seeded: Bus) -> None:
    base = await serve(None)
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


async def test_example_application_screenshots(chromium: Browser, tmp_path: Path) -> None:
    """The README's pictures: the example application's order flow (SQLite), with declined cards."""
    from schemas import OrderPlaced as ExampleOrder
    from tests.apps.web_example import build

    from ...support.helpers import drain

    dsn = f"sqlite:///{tmp_path / 'example.db'}"
    bus = build(dsn)
    try:
        await bus.migrate()
        amounts = [1_250, 4_999, 72_000, 18_500, 3_300, 99_900, 640, 27_000]
        await bus.publish_many(
            ExampleOrder(order_id=f"ord-{1000 + i}", customer=f"cust-{i % 3}", amount_cents=a)
            for i, a in enumerate(amounts)
        )
        await drain(bus)
        context = await chromium.new_context(viewport={"width": 1280, "height": 720})
        try:
            # As `eventbus dashboard tests.apps.web_example:bus` does.
            async with serve_app(build(dsn), None) as base:
                await _example_pages(await context.new_page(), bus, base)
        finally:
            await context.close()  # the pages' event streams end before the dashboard stops
    finally:
        await bus.aclose()


async def _example_pages(page: Page, bus: Bus, base: str) -> None:
    await page.goto(base + "/")
    await expect(page.locator("main")).to_contain_text("payments.capture")
    await _shot(page, "example", "overview")
    (shipped, *_) = await bus.find_deliveries(DeliveryFilter(subscription="shipping.notify-customer"))
    await page.goto(f"{base}/events/{shipped.event_id}")
    await expect(page.locator("#chain li")).to_have_count(4)
    await _shot(page, "example", "event")
    await page.goto(base + "/dead")
    await expect(page.locator("#count")).to_have_text("2")


@ONE  # both backends: test_triage.py
async def test_triage_through_the_ui(page: Page, serve, seeded: Bus, backend_kind: str) -> None:
    base = await serve(TOKEN)
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
