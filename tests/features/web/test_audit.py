"""The audit trail through the dashboard: one row per action, and the ``/audit`` page (both backends)."""

from __future__ import annotations

from typing import Any

import httpx

from eventbus import Bus
from eventbus.types import DeliveryFilter
from eventbus.web import create_app

from ...support.helpers import OrderPlaced
from ._data import pay
from .conftest import OPERATOR, ORIGIN, unlock


def _post(client: httpx.AsyncClient, url: str, data: Any) -> Any:
    return client.post(url, data=data, headers={"Origin": ORIGIN})


async def _act(rw: httpx.AsyncClient, bus: Bus, csrf: str) -> list[int]:
    """Every dashboard action once; returns the dead-letter ids it found first."""
    dead = [d.id for d in await bus.find_deliveries(DeliveryFilter(status="dead"))]
    later = await bus.publish(OrderPlaced(order_id="later"), delay=3600)
    (pending,) = await bus.find_deliveries(DeliveryFilter(event_id=later.event_id))
    (approval,) = await bus.workflows.approvals(pay, "c-1")
    posts: list[tuple[str, dict[str, Any]]] = [
        ("/dead/action", {"op": "purge", "ids": dead[:1], "confirm": "yes"}),
        ("/dead/action", {"op": "replay", "scope": "filter", "subscription": "charge", "confirm": "yes"}),
        ("/deliveries/cancel", {"ids": [str(pending.id)]}),
        ("/subscriptions/ship/pause", {}),
        ("/subscriptions/ship/resume", {}),
        ("/schedules/hourly-report/pause", {}),
        ("/schedules/hourly-report/resume", {}),
        ("/schedules/hourly-report/trigger", {}),
        (f"/approvals/{approval.id}/approve", {"reason": "fine"}),
        ("/machines/pay/instances/c-1/pause", {"reason": "hold"}),
        ("/machines/pay/instances/c-1/resume", {"reason": "go"}),
        ("/machines/pay/instances/c-1/repoint", {"to": "DENIED", "reason": "customer left"}),
    ]
    for url, form in posts:
        r = await _post(rw, url, {**form, "csrf": csrf})
        assert r.status_code == 303, (url, r.text)
    return [dead[0], pending.id, approval.id]


async def test_each_action_writes_one_row_and_the_page_lists_them(rw: httpx.AsyncClient, seeded: Bus) -> None:
    csrf = await unlock(rw)
    purged, cancelled, approval = await _act(rw, seeded, csrf)
    rows = (await seeded.audit.entries())[::-1]
    assert [(r.action, r.target, r.count) for r in rows] == [
        ("purge", f"ids {purged}", 1),
        ("replay", "dead letters", 2),
        ("cancel", f"ids {cancelled}", 1),
        ("pause", "subscription ship", 1),
        ("resume", "subscription ship", 1),
        ("pause", "schedule hourly-report", None),
        ("resume", "schedule hourly-report", None),
        ("trigger", "schedule hourly-report", 1),
        ("approve", f"approval {approval} of pay/c-1", 1),
        ("pause", "instance pay/c-1", 1),
        ("resume", "instance pay/c-1", 1),
        ("repoint", "instance pay/c-1", 1),
    ]
    assert rows[1].filter == "all matching subscription=charge"
    assert rows[-1].filter == "to=DENIED, reason=customer left"
    assert {(r.actor, r.origin, r.interface) for r in rows} == {(OPERATOR, "127.0.0.1", "dashboard")}
    page = await rw.get("/audit?action=pause&actor=alice")
    assert page.status_code == 200
    assert page.text.count("<td>pause</td>") == 3 and "<td>resume</td>" not in page.text
    assert "schedule hourly-report" in page.text and "instance pay/c-1" in page.text
    bad = await rw.get("/audit?action=explode")
    assert bad.status_code == 400 and "unknown audit action" in bad.text


async def test_the_audit_page_pages_by_keyset(bus: Bus) -> None:
    for i in range(5):
        await bus.audit.record("cancel", f"ids {i}", actor="bob", origin="h", interface="cli", count=i)
    app = create_app(bus, page_size=2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as ro:
        first = await ro.get("/audit?actor=bob")
        assert "<td>ids 4</td>" in first.text and "<td>ids 3</td>" in first.text
        assert "<td>ids 2</td>" not in first.text and "← newest" not in first.text
        older = first.text.split('href="/audit?')[-1].split('"')[0].replace("&amp;", "&")
        second = await ro.get(f"/audit?{older}")
        assert "<td>ids 2</td>" in second.text and "<td>ids 1</td>" in second.text
        assert "<td>ids 3</td>" not in second.text and "← newest" in second.text
