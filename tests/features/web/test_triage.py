"""The triage page over HTTP on each backend: groups by cause, filters, a group's tracebacks, and
group and filter actions acting on exactly the confirmed set."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

from eventbus import Bus, Context, RetryPolicy
from eventbus.types import DeliveryFilter

from ...support.helpers import PaymentRequested, drain
from .conftest import ORIGIN, TOKEN, client_of

DEAD = DeliveryFilter(status="dead")


def _post(client: httpx.AsyncClient, data: Any) -> Any:
    return client.post("/triage/action", data=data, headers={"Origin": ORIGIN})


def _hidden(page: str) -> dict[str, str]:
    found = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page)
    return {k: html.unescape(v) for k, v in found}


async def test_dead_letters_grouped_filtered_and_acted_on(rw: httpx.AsyncClient, seeded: Bus) -> None:
    page = await rw.get("/triage")
    assert page.status_code == 200 and ">3</td>" in page.text
    assert "RuntimeError: card declined &lt;b&gt;bad-&lt;n&gt;&lt;script&gt;&lt;/b&gt;" in page.text
    example = int(re.findall(r'/triage/deliveries/(\d+)"', page.text)[0])
    trace = await rw.get(f"/triage/deliveries/{example}")
    assert trace.status_code == 200 and "Traceback (most recent call last)" in trace.text
    assert "attempt 2" in trace.text and "attempt 1" in trace.text
    one = await rw.get("/triage", params={"error_contains": "BAD-1"})
    assert "1 matching deliveries grouped" in html.unescape(re.sub(r"<[^>]+>", "", one.text))
    # everything matching a filter: the payload of one order
    preview = await _post(rw, {"op": "replay", "payload_contains": "bad-2", "token": TOKEN})
    assert '<strong id="preview-count">1</strong>' in preview.text
    done = await _post(rw, {**_hidden(preview.text), "token": TOKEN})
    assert "flash=replay&n=1" in done.headers["location"]
    # a group: its pattern matches whole errors, so another message matches nothing
    form = {"op": "purge", "subscription": "charge", "token": TOKEN}
    other = await _post(rw, {**form, "message_pattern": "RuntimeError: card accepted <b>bad-<n>"})
    assert '<strong id="preview-count">0</strong>' in other.text and "disabled" in other.text
    group = "RuntimeError: card declined <b>bad-<n><script></b>"
    preview = await _post(rw, {**form, "message_pattern": group})
    assert '<strong id="preview-count">2</strong>' in preview.text
    assert await seeded.count_deliveries(DEAD) == 2, "the preview changes nothing"
    done = await _post(rw, {**_hidden(preview.text), "token": TOKEN})
    assert done.status_code == 303 and "flash=purge&n=2" in done.headers["location"]
    assert await seeded.count_deliveries(DEAD) == 0
    assert await seeded.count_deliveries(DeliveryFilter(subscription="charge", status="pending")) == 1
    trail = await seeded.audit.entries(limit=10)
    recorded = [(e.action, e.count, e.interface) for e in trail]
    assert recorded == [("purge", 2, "dashboard"), ("replay", 1, "dashboard")]
    assert trail[0].target == "dead deliveries (triage)" and "charge" in (trail[0].filter or "")
    wrong = await _post(rw, {"op": "cancel", "token": TOKEN})
    assert wrong.status_code == 400 and "op must be one of replay, purge" in wrong.text


async def test_failing_deliveries_grouped_and_cancelled(bus: Bus) -> None:
    @bus.subscribe(PaymentRequested, name="pay", retry=RetryPolicy(max_attempts=5, base_delay_seconds=3600))
    async def pay(event: PaymentRequested, ctx: Context) -> None:
        raise TimeoutError(f"gateway {event.order_id} timed out")

    await bus.publish_many([PaymentRequested(order_id=f"p-{i}") for i in range(3)])
    await drain(bus, wait_for_scheduled=False)
    await bus.publish(PaymentRequested(order_id="fresh"))
    async with client_of(bus, TOKEN) as client:
        page = await client.get("/triage", params={"kind": "failing"})
        assert "TimeoutError: gateway p-&lt;n&gt; timed out" in page.text and ">3</td>" in page.text
        read_only = await _post(client, {"kind": "failing", "op": "cancel"})
        assert read_only.status_code == 403
        preview = await _post(client, {"kind": "failing", "op": "cancel", "token": TOKEN})
        assert '<strong id="preview-count">3</strong>' in preview.text
        done = await _post(client, {**_hidden(preview.text), "token": TOKEN})
        assert "flash=triage-cancel&n=3" in done.headers["location"]
    assert await bus.count_deliveries(DeliveryFilter(status="cancelled")) == 3
    assert await bus.count_deliveries(DeliveryFilter(status="pending")) == 1
