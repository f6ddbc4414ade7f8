"""Retry now through the dashboard in a real browser, with its confirmation (see test_browser.py)."""

from __future__ import annotations

from playwright.async_api import Page, expect

from eventbus import Bus
from eventbus.types import DeliveryFilter

from ._browser import shot
from .conftest import OPERATOR, TOKEN
from .test_browser import ONE
from .test_stuck import _retrying


@ONE  # both backends: test_stuck.py
async def test_retry_now_through_the_ui(page: Page, serve, seeded: Bus, backend_kind: str) -> None:
    retrying = await _retrying(seeded)
    base = await serve(TOKEN)
    await page.goto(base + "/deliveries?condition=retrying")
    await page.fill("input[name=operator]", OPERATOR)
    await page.fill("input[name=token]", TOKEN)
    await page.click("text=Unlock")
    await expect(page.locator(".flash")).to_contain_text("actions unlocked")
    await page.goto(base + "/deliveries?condition=retrying")
    await expect(page.locator("td.timing")).to_contain_text("attempt 2 of 2")
    await shot(page, "retrying", backend_kind)
    await page.click(f"a[title='delivery {retrying}']")
    await expect(page.locator("#waiting-on")).to_contain_text("next attempt at")
    await page.click("text=Retry now…")
    await expect(page.locator("#preview-count")).to_have_text("1")
    await shot(page, "confirm-retry", backend_kind)
    waiting = DeliveryFilter(condition="retrying")
    assert await seeded.count_deliveries(waiting) == 1, "the preview changes nothing"
    await page.click("text=Yes, retry now")
    await expect(page.locator(".flash")).to_contain_text("retry now: 1 delivery(ies) due now")
    await expect(page.locator("h1")).to_contain_text(f"Delivery #{retrying}")
    assert await seeded.count_deliveries(waiting) == 0
    (entry,) = await seeded.audit.entries(action="retry")
    assert (entry.actor, entry.count) == (OPERATOR, 1)
