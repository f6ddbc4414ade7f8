"""The dashboard's pages and actions, in process, on both backends."""

from __future__ import annotations

import re
from typing import Any

import anyio
import httpx
import pytest

from eventbus import Bus, Event, Worker
from eventbus.types import DeliveryFilter
from eventbus.web import create_app

from ...support.helpers import OrderPlaced
from ..workflows._support import finish
from ._data import drain_orders, pay, state
from .conftest import OPERATOR, ORIGIN, TOKEN, unlock

PAGES = [
    "/",
    "/deliveries",
    "/deliveries?status=dead&subscription=charge",
    "/deliveries?payload_path=order_id&payload_value=ok-1",
    "/events/1",
    "/dead",
    "/dead?subscription=charge",
    "/machines",
    "/machines/pay",
    "/machines/pay/instances/c-1",
    "/schedules",
    "/schedules/hourly-report",
]


def _post(client: httpx.AsyncClient, url: str, data: Any, **headers: str) -> Any:
    return client.post(url, data=data, headers={"Origin": ORIGIN, **headers})


async def _dead_ids(bus: Bus) -> list[int]:
    return [d.id for d in await bus.find_deliveries(DeliveryFilter(status="dead"))]


@pytest.mark.parametrize("url", PAGES)
async def test_every_page_renders(shared_ro: httpx.AsyncClient, url: str) -> None:
    r = await shared_ro.get(url)
    assert r.status_code == 200, r.text
    assert "<script>" not in r.text.replace('<script src="/static/dashboard.js"></script>', "")
    assert "read-only" in r.text


async def test_overview_shows_backlog_and_dead(shared_ro: httpx.AsyncClient) -> None:
    r = await shared_ro.get("/")
    row = re.search(
        r"<tr>\s*<td><a href=\"/deliveries\?subscription=charge\">charge</a>.*?</tr>", r.text, re.S
    )
    assert row is not None
    cells = re.findall(r'<td class="num">(.*?)</td>', row.group(0), re.S)
    assert cells[2:6] == ["0", "0", "3", "3"]  # in flight, stuck, done in the last hour, completed
    assert ">3</a>" in cells[6]  # dead, linked to the dead letters


async def test_overview_counts_completed_among_the_newest_deliveries_past_the_cap(shared_bus: Bus) -> None:
    """Past count_cap deliveries the overview reads only the newest ones: lower bounds, marked."""
    app = create_app(shared_bus, count_cap=4)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
        r = await client.get("/")
    assert r.status_code == 200
    assert re.search(r"<p>4\+ events in the log", r.text), r.text
    row = re.search(
        r"<tr>\s*<td><a href=\"/deliveries\?subscription=charge\">charge</a>.*?</tr>", r.text, re.S
    )
    assert row is not None
    cells = re.findall(r'<td class="num">(.*?)</td>', row.group(0), re.S)
    assert cells[5].endswith("+") and ">3</a>" in cells[6]  # completed: a lower bound; dead: exact
    assert "counted among the newest 4 deliveries only" in r.text


async def test_overview_shows_the_storage_strip_where_it_exists(
    shared_ro: httpx.AsyncClient, shared_bus: Bus
) -> None:
    r = await shared_ro.get("/")
    if shared_bus.backend.kind == "postgres":
        assert "<h2>Storage</h2>" in r.text and "xmin horizon" in r.text
        assert re.search(r"<td>deliveries</td>", r.text)
    else:  # SQLite has no table statistics, and nothing was pruned yet
        assert "<h2>Storage</h2>" not in r.text


async def test_payloads_and_errors_are_escaped(shared_ro: httpx.AsyncClient, shared_bus: Bus) -> None:
    (dead, *_) = await shared_bus.find_deliveries(DeliveryFilter(status="dead"))
    r = await shared_ro.get(f"/events/{dead.event_id}")
    assert "bad-" in r.text and "&lt;script&gt;" in r.text and "<b>" not in r.text
    assert "&lt;b&gt;bad-" in r.text  # the traceback's message, escaped
    assert "Traceback" in r.text and "RuntimeError" in r.text


async def test_event_page_shows_the_causation_chain(shared_ro: httpx.AsyncClient, shared_bus: Bus) -> None:
    (notify, *_) = await shared_bus.find_deliveries(DeliveryFilter(subscription="notify"))
    r = await shared_ro.get(f"/events/{notify.event_id}")
    chain = re.search(r'<ul class="tree" id="chain">(.*?)</ul>', r.text, re.S)
    assert chain is not None
    order = re.findall(r"(test\.\w+) #", chain.group(1))
    assert order == ["test.order_placed", "test.payment_requested", "test.shipped"]
    assert '<li class="depth-2">' in chain.group(1)  # the grandchild is indented twice


async def test_event_page_shows_the_stored_version(ro: httpx.AsyncClient, seeded: Bus) -> None:
    class Versioned(Event, event_type="test.web_versioned", version=3):
        n: int

    published = await seeded.publish(Versioned(n=1))
    r = await ro.get(f"/events/{published.event_id}")
    assert "<tr><th>version</th><td>3</td></tr>" in r.text


async def test_deliveries_page_counts_past_a_cap_and_pages_by_cursor(shared_bus: Bus) -> None:
    app = create_app(shared_bus, page_size=4, count_cap=5)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
        first = await client.get("/deliveries")
        assert '<strong id="count">5+</strong>' in first.text
        more = re.search(r'href="/deliveries\?(before=\d+)">older', first.text)
        assert more is not None
        second = await client.get(f"/deliveries?{more.group(1)}")
        seen = [re.findall(r'<td class="num did">(\d+)</td>', page.text) for page in (first, second)]
        ids = [int(i) for i in seen[0] + seen[1]]
        assert len(ids) == 8 and ids == sorted(ids, reverse=True) and len(set(ids)) == 8
        counted = await client.get("/deliveries?subscription=notify")
        assert '<strong id="count">3</strong>' in counted.text


async def test_a_bad_filter_is_a_clear_error(shared_ro: httpx.AsyncClient) -> None:
    r = await shared_ro.get("/deliveries?event_id=abc")
    assert r.status_code == 400 and "event_id must be a whole number" in r.text
    r = await shared_ro.get("/deliveries?payload_path=x;drop&payload_value=1")
    assert r.status_code == 400 and "payload path" in r.text
    assert (await shared_ro.get("/events/999")).status_code == 404


async def test_replay_one_round_trip(rw: httpx.AsyncClient, seeded: Bus) -> None:
    (first, *_) = await _dead_ids(seeded)
    preview = await _post(rw, "/dead/action", {"op": "replay", "ids": first, "token": TOKEN})
    assert preview.status_code == 200 and '<strong id="preview-count">1</strong>' in preview.text
    assert len(await _dead_ids(seeded)) == 3, "the preview changes nothing"
    done = await _post(rw, "/dead/action", {"op": "replay", "ids": first, "token": TOKEN, "confirm": "yes"})
    assert done.status_code == 303 and "replay" in done.headers["location"]
    state["broken"] = False
    await drain_orders(seeded)
    assert (await seeded.delivery(first)).status == "completed"
    assert len(await _dead_ids(seeded)) == 2


async def test_bulk_replay_by_filter(rw: httpx.AsyncClient, seeded: Bus) -> None:
    form = {"op": "replay", "scope": "filter", "subscription": "charge", "token": TOKEN}
    preview = await _post(rw, "/dead/action", form)
    assert (
        '<strong id="preview-count">3</strong>' in preview.text
        and "all matching subscription=charge" in preview.text
    )
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', preview.text))
    assert hidden["scope"] == "filter" and hidden["subscription"] == "charge" and hidden["confirm"] == "yes"
    done = await _post(rw, "/dead/action", {**hidden, "token": TOKEN})
    assert done.status_code == 303
    assert await _dead_ids(seeded) == []
    state["broken"] = False
    await drain_orders(seeded)
    assert await seeded.count_deliveries(DeliveryFilter(subscription="notify")) == 6


async def test_purge_a_selection(rw: httpx.AsyncClient, seeded: Bus) -> None:
    ids = await _dead_ids(seeded)
    form = {"op": "purge", "ids": ids[:2], "token": TOKEN, "confirm": "yes"}
    assert (await _post(rw, "/dead/action", form)).status_code == 303
    assert await _dead_ids(seeded) == ids[2:]


async def test_approval_through_the_dashboard(rw: httpx.AsyncClient, seeded: Bus) -> None:
    page = await rw.get("/machines/pay/instances/c-1")
    approval = re.search(r'action="/approvals/(\d+)/approve"', page.text)
    assert approval is None, "no form before the browser is unlocked"
    (row,) = await seeded.workflows.approvals(pay, "c-1")
    csrf = await unlock(rw)
    r = await _post(rw, f"/approvals/{row.id}/approve", {"csrf": csrf, "reason": "looks fine"})
    assert r.status_code == 303
    (row,) = await seeded.workflows.approvals(pay, "c-1")
    assert row.status == "approved" and row.decided_by == OPERATOR and row.reason == "looks fine"
    again = await _post(rw, f"/approvals/{row.id}/approve", {"csrf": csrf})
    assert again.status_code == 400 and "GuardMismatch" in again.text  # a decision is made once
    await finish(seeded, pay, ["c-1"])
    assert (await seeded.workflows.instance(pay, "c-1")).state == "DONE"


async def test_repoint_and_schedule_and_subscription_actions(rw: httpx.AsyncClient, seeded: Bus) -> None:
    form = {"token": TOKEN, "to": "DENIED", "reason": "customer left", "expect": "CHARGE"}
    assert (await _post(rw, "/machines/pay/instances/c-1/repoint", form)).status_code == 303
    assert (await seeded.workflows.instance(pay, "c-1")).state == "DENIED"
    assert (await _post(rw, "/schedules/hourly-report/pause", {"token": TOKEN})).status_code == 303
    assert (await seeded.schedules.info("hourly-report")).paused
    assert (await _post(rw, "/schedules/hourly-report/resume", {"token": TOKEN})).status_code == 303
    assert (await _post(rw, "/schedules/hourly-report/trigger", {"token": TOKEN})).status_code == 303
    assert (await seeded.schedules.info("hourly-report")).requested
    assert (await _post(rw, "/subscriptions/ship/pause", {"token": TOKEN})).status_code == 303
    assert {s.name: s.state for s in await seeded.list_subscriptions()}["ship"] == "paused"


async def test_cancel_selected_pending_deliveries(rw: httpx.AsyncClient, seeded: Bus) -> None:
    later = await seeded.publish(OrderPlaced(order_id="later"), delay=3600)
    (pending,) = await seeded.find_deliveries(DeliveryFilter(event_id=later.event_id))
    await unlock(rw)
    page = await rw.get("/deliveries?status=pending")
    assert 'action="/deliveries/cancel"' in page.text and f'value="{pending.id}"' in page.text
    (done,) = await seeded.find_deliveries(DeliveryFilter(status="completed"), limit=1)
    form = {"token": TOKEN, "ids": [str(pending.id), str(done.id)]}
    assert (await _post(rw, "/deliveries/cancel", form)).status_code == 303
    assert [d.status for d in await seeded.find_deliveries(DeliveryFilter(event_id=pending.event_id))] == [
        "cancelled"
    ]
    assert (await seeded.delivery(done.id)).status == "completed"  # only pending ones are cancelled


async def test_pause_resume_and_cancel_an_instance(rw: httpx.AsyncClient, seeded: Bus) -> None:
    csrf = await unlock(rw)  # an unlocked browser: the page renders its forms
    page = await rw.get("/machines/pay/instances/c-1")
    assert "/instances/c-1/pause" in page.text and "/instances/c-1/resume" not in page.text
    form = {"csrf": csrf, "reason": "hold on"}
    assert (await _post(rw, "/machines/pay/instances/c-1/pause", form)).status_code == 303
    assert (await seeded.workflows.instance(pay, "c-1")).status == "paused"
    page = await rw.get("/machines/pay/instances/c-1")
    assert "/instances/c-1/resume" in page.text and "/instances/c-1/pause" not in page.text
    assert (await _post(rw, "/machines/pay/instances/c-1/resume", form)).status_code == 303
    assert (await seeded.workflows.instance(pay, "c-1")).status != "paused"
    assert (await _post(rw, "/machines/pay/instances/c-1/cancel", form)).status_code == 303
    inst = await seeded.workflows.instance(pay, "c-1")
    assert inst.status == "cancelled"
    history = await seeded.workflows.history(pay, "c-1")
    assert [r.reason for r in history[-3:]] == ["hold on"] * 3
    assert all(r.actor == f"operator:{OPERATOR}" for r in history[-3:])


async def test_read_only_refuses_every_action(shared_ro: httpx.AsyncClient, shared_bus: Bus) -> None:
    ids = await _dead_ids(shared_bus)
    for url, form in [
        ("/dead/action", {"op": "purge", "ids": ids, "confirm": "yes", "token": TOKEN}),
        ("/schedules/hourly-report/pause", {"token": TOKEN}),
        ("/unlock", {"token": TOKEN}),
    ]:
        r = await _post(shared_ro, url, form)
        assert r.status_code == 403 and "read-only" in r.text
    page = await shared_ro.get("/dead")
    assert "Purge" not in page.text and 'name="ids"' not in page.text
    assert await _dead_ids(shared_bus) == ids
    assert not (await shared_bus.schedules.info("hourly-report")).paused


async def test_actions_need_the_token_and_the_same_origin(rw: httpx.AsyncClient, seeded: Bus) -> None:
    ids = await _dead_ids(seeded)
    form = {"op": "purge", "ids": ids, "confirm": "yes"}
    assert (await _post(rw, "/dead/action", form)).status_code == 403
    assert (await _post(rw, "/dead/action", {**form, "token": "wrong"})).status_code == 403
    evil = await rw.post(
        "/dead/action", data={**form, "token": TOKEN}, headers={"Origin": "http://evil.example"}
    )
    assert evil.status_code == 403 and "cross-origin" in evil.text
    bare = await rw.post("/dead/action", data={**form, "token": TOKEN})
    assert bare.status_code == 403
    assert (await rw.get("/dead/action")).status_code == 405
    assert await _dead_ids(seeded) == ids
    header = await _post(rw, "/dead/action", form, **{"X-Dashboard-Token": TOKEN})
    assert header.status_code == 303 and await _dead_ids(seeded) == []


async def test_unlock_puts_a_session_value_not_the_token_in_forms(shared_rw: httpx.AsyncClient) -> None:
    assert (await _post(shared_rw, "/unlock", {"token": "wrong", "operator": OPERATOR})).status_code == 403
    r = await _post(shared_rw, "/unlock", {"token": TOKEN, "operator": OPERATOR})
    assert r.status_code == 303 and "httponly" in r.headers["set-cookie"].lower()
    assert TOKEN not in r.headers["set-cookie"]
    page = await shared_rw.get("/dead")
    assert TOKEN not in page.text and 'name="csrf"' in page.text and "Purge all matching" in page.text


async def test_live_stream_says_refresh_when_counts_change(seeded: Bus) -> None:
    app = create_app(seeded, live_interval=0.05)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
        body: list[str] = []

        async def listen() -> None:
            r = await client.get("/live?max_seconds=1.0")
            assert r.headers["content-type"].startswith("text/event-stream")
            body.append(r.text)

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            await anyio.sleep(0.3)
            await seeded.publish(OrderPlaced(order_id="live"))
        assert body[0].startswith("retry:") and "event: refresh" in body[0]


async def test_mounted_under_a_prefix_links_stay_inside(shared_bus: Bus) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/ops/bus", app=create_app(shared_bus))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=host), base_url=ORIGIN) as client:
        page = await client.get("/ops/bus/dead")
        assert page.status_code == 200 and 'href="/ops/bus/deliveries"' in page.text
        assert (await client.get("/ops/bus/static/dashboard.js")).status_code == 200


async def test_a_worker_is_listed(ro: httpx.AsyncClient, seeded: Bus) -> None:
    worker = Worker(seeded, poll_interval_seconds=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while not (await seeded.status()).workers:
                await anyio.sleep(0.05)
        page = await ro.get("/")
        worker.stop()
    assert worker.id[:8] in page.text
