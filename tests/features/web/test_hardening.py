"""The dashboard's guard and its edges: sessions, hosts, headers, bad input, big payloads, stale workers."""

from __future__ import annotations

import re
import sqlite3
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from eventbus import Bus, Context
from eventbus.errors import ConfigurationError
from eventbus.types import DeliveryFilter
from eventbus.web import create_app
from eventbus.web._guard import COOKIE, UNLOCK_TRIES

from ...support.helpers import OrderPlaced, Shipped, drain
from ._data import Tick
from .conftest import OPERATOR, ORIGIN, TOKEN, unlock

BIG = 2**70  # past any id either backend can store


def _post(client: httpx.AsyncClient, url: str, data: Any, **headers: str) -> Any:
    return client.post(url, data=data, headers={"Origin": ORIGIN, **headers})


def _client(bus: Bus, base_url: str = ORIGIN, peer: str = "127.0.0.1", **options: Any) -> httpx.AsyncClient:
    app = create_app(bus, TOKEN, **options)
    transport = httpx.ASGITransport(app=app, client=(peer, 50_000))
    return httpx.AsyncClient(transport=transport, base_url=base_url)


# -- sessions -----------------------------------------------------------------------------------


async def test_a_session_value_works_only_with_its_own_session(seeded: Bus) -> None:
    async with _client(seeded) as a, _client(seeded) as b:
        csrf_a = await unlock(a, "alice")
        await unlock(b, "bob")
        r = await _post(b, "/schedules/hourly-report/pause", {"csrf": csrf_a})
        assert r.status_code == 403, "another session's value is refused"
        b.cookies.clear()
        r = await _post(b, "/schedules/hourly-report/pause", {"csrf": csrf_a})
        assert r.status_code == 403, "a value without its session is refused"
        assert not (await seeded.schedules.info("hourly-report")).paused
        assert (await _post(a, "/schedules/hourly-report/pause", {"csrf": csrf_a})).status_code == 303
        assert (await seeded.schedules.info("hourly-report")).paused


async def test_a_forged_session_cookie_is_not_a_session(shared_bus: Bus) -> None:
    async with _client(shared_bus) as client:
        csrf = await unlock(client)
        value = client.cookies[COOKIE]
        nonce, _, mac = value.split(".")
        client.cookies.set(COOKIE, f"{nonce}.Ym9i.{mac}")  # the name swapped for "bob"
        page = await client.get("/")
        assert "actions enabled" not in page.text and "Unlock" in page.text
        assert (await _post(client, "/schedules/hourly-report/pause", {"csrf": csrf})).status_code == 403


async def test_unlock_needs_a_name_unless_one_is_configured(shared_bus: Bus) -> None:
    async with _client(shared_bus) as client:
        r = await _post(client, "/unlock", {"token": TOKEN})
        assert r.status_code == 400 and "name" in r.text
    async with _client(shared_bus, operator="ops-team") as client:
        assert (await _post(client, "/unlock", {"token": TOKEN})).status_code == 303
        assert '<strong id="operator">ops-team</strong>' in (await client.get("/")).text


async def test_lock_ends_the_session(shared_bus: Bus) -> None:
    async with _client(shared_bus) as client:
        csrf = await unlock(client)
        assert "Lock</button>" in (await client.get("/")).text
        r = await _post(client, "/lock", {})
        assert r.status_code == 303 and "flash=locked" in r.headers["location"]
        page = await client.get(r.headers["location"])
        assert "locked: unlock again to act" in page.text and 'action="/unlock"' in page.text
        assert (await _post(client, "/schedules/hourly-report/pause", {"csrf": csrf})).status_code == 403


async def test_unlock_is_rate_limited_per_client(shared_bus: Bus) -> None:
    async with _client(shared_bus) as client, _client(shared_bus, peer="10.0.0.2") as other:
        other.cookies.clear()
        for _ in range(UNLOCK_TRIES):
            r = await _post(client, "/unlock", {"token": "guess", "operator": OPERATOR})
            assert r.status_code == 403
        r = await _post(client, "/unlock", {"token": TOKEN, "operator": OPERATOR})
        assert r.status_code == 429 and "too many wrong tokens" in r.text
        assert COOKIE not in client.cookies
    # One guard per application: a new app (a restart) or another client starts afresh.
    async with _client(shared_bus, peer="10.0.0.2") as other:
        assert (await _post(other, "/unlock", {"token": TOKEN, "operator": OPERATOR})).status_code == 303


# -- hosts and headers ----------------------------------------------------------------------------


async def test_only_the_allowed_hosts_are_served(shared_bus: Bus) -> None:
    async with _client(shared_bus, base_url="http://rebound.example") as client:
        r = await client.get("/dead")
        assert r.status_code == 400 and "bad letter" not in r.text
    async with _client(shared_bus, base_url="http://127.0.0.1:8700") as client:
        assert (await client.get("/dead")).status_code == 200
    async with _client(shared_bus, base_url="http://ops.example", allowed_hosts=["ops.example"]) as client:
        assert (await client.get("/dead")).status_code == 200


async def test_every_response_carries_the_security_headers(shared_ro: httpx.AsyncClient) -> None:
    for url in ("/", "/events/1", "/events/999", "/static/dashboard.css"):
        r = await shared_ro.get(url)
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, url
        assert r.headers["x-content-type-options"] == "nosniff", url
        assert r.headers["referrer-policy"] == "same-origin", url
        assert "style=" not in r.text, "an inline style would be blocked by the policy"


# -- small defects --------------------------------------------------------------------------------


async def test_a_schedule_named_with_a_slash_can_be_operated(rw: httpx.AsyncClient, seeded: Bus) -> None:
    seeded.schedule("reports/daily", Tick, every=timedelta(days=1))
    await seeded.schedules.declare()
    csrf = await unlock(rw)
    page = await rw.get("/schedules/reports/daily")
    assert page.status_code == 200 and 'action="/schedules/reports/daily/pause"' in page.text
    for op in ("pause", "resume", "trigger"):
        r = await _post(rw, f"/schedules/reports/daily/{op}", {"csrf": csrf})
        assert r.status_code == 303, (op, r.text)
        if op == "pause":
            assert (await seeded.schedules.info("reports/daily")).paused
    info = await seeded.schedules.info("reports/daily")
    assert not info.paused and info.requested


async def test_a_subscription_named_with_a_slash_can_be_paused(rw: httpx.AsyncClient, seeded: Bus) -> None:
    @seeded.subscribe(Shipped, name="team/notify")
    async def notify(event: Shipped, ctx: Context) -> None:
        pass

    await drain(seeded, subscriptions=["team/notify"])  # the worker records it
    csrf = await unlock(rw)
    page = await rw.get("/")
    assert 'action="/subscriptions/team/notify/pause"' in page.text
    assert (await _post(rw, "/subscriptions/team/notify/pause", {"csrf": csrf})).status_code == 303
    assert {s.name: s.state for s in await seeded.list_subscriptions()}["team/notify"] == "paused"


async def test_paging_ends_on_a_full_page_and_goes_back_up(shared_bus: Bus) -> None:
    """Six deliveries of charge at three a page: two pages, no empty third, and a way back."""
    app = create_app(shared_bus, page_size=3)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
        first = await client.get("/deliveries?subscription=charge")
        older = re.search(r'href="/deliveries\?([^"]+)">older', first.text)
        assert older is not None and "newer" not in first.text
        second = await client.get("/deliveries?" + older.group(1).replace("&amp;", "&"))
        assert len(re.findall(r'class="num did"', second.text)) == 3
        assert "older" not in second.text, "no link to an empty page"
        newer = re.search(r'href="/deliveries\?([^"]*)">← newer', second.text)
        assert newer is not None
        back = await client.get("/deliveries?" + newer.group(1).replace("&amp;", "&"))
        ids = re.findall(r'<td class="num did">(\d+)</td>', back.text)
        assert ids == re.findall(r'<td class="num did">(\d+)</td>', first.text)


async def test_the_newer_link_from_deep_down_leads_to_the_page_just_above(shared_bus: Bus) -> None:
    app = create_app(shared_bus, page_size=2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
        ids = [d.id for d in await shared_bus.find_deliveries(DeliveryFilter(subscription="charge"))]
        third = await client.get(f"/deliveries?subscription=charge&before={ids[3]}")
        assert re.findall(r'<td class="num did">(\d+)</td>', third.text) == [str(i) for i in ids[4:6]]
        newer = re.search(r'href="/deliveries\?([^"]*)">← newer', third.text)
        assert newer is not None
        second = await client.get("/deliveries?" + newer.group(1).replace("&amp;", "&"))
        assert re.findall(r'<td class="num did">(\d+)</td>', second.text) == [str(i) for i in ids[2:4]]
    above = await shared_bus.find_deliveries(DeliveryFilter(subscription="charge"), limit=2, after_id=ids[4])
    assert [d.id for d in above] == ids[2:4]
    with pytest.raises(ConfigurationError):
        await shared_bus.find_deliveries(limit=2, before_id=ids[0], after_id=ids[4])


@pytest.mark.parametrize("given", ["nan", "-1", "soon", "-inf"])
async def test_a_bad_stream_length_is_a_clear_error(shared_ro: httpx.AsyncClient, given: str) -> None:
    r = await shared_ro.get(f"/live?max_seconds={given}")
    assert r.status_code == 400 and "max_seconds must be a number" in r.text


async def test_out_of_range_ids_are_not_found_or_refused_cleanly(shared_rw: httpx.AsyncClient) -> None:
    for url in (f"/events/{BIG}", "/events/-1", f"/events/{BIG}/payload"):
        r = await shared_rw.get(url)
        assert r.status_code == 404 and "no such event" in r.text, url
    for url in (f"/deliveries?event_id={BIG}", f"/deliveries?before={BIG}", f"/dead?before={BIG}"):
        r = await shared_rw.get(url)
        assert r.status_code == 400 and "must be a whole number from 0 to" in r.text, url
        assert "bigint" not in r.text and "Overflow" not in r.text, url
    csrf = await unlock(shared_rw)
    r = await _post(shared_rw, f"/approvals/{BIG}/approve", {"csrf": csrf})
    assert r.status_code == 404 and "no such approval" in r.text


async def test_flash_shows_known_messages_only(shared_ro: httpx.AsyncClient) -> None:
    page = await shared_ro.get("/dead?flash=Your+session+expired:+call+555-0100")
    assert "555-0100" not in page.text and 'class="flash"' not in page.text
    page = await shared_ro.get("/dead?flash=replay&n=3")
    assert '<div class="flash" role="status">replay: 3 dead letter(s)</div>' in page.text
    page = await shared_ro.get("/dead?flash=replay&n=<b>")
    assert 'class="flash"' not in page.text


async def test_the_confirmation_cancel_keeps_the_filter(shared_rw: httpx.AsyncClient) -> None:
    csrf = await unlock(shared_rw)
    form = {"op": "purge", "scope": "filter", "subscription": "charge", "csrf": csrf}
    preview = await _post(shared_rw, "/dead/action", form)
    assert preview.status_code == 200 and '<a href="/dead?subscription=charge">cancel</a>' in preview.text
    assert f'value="{csrf}"' in preview.text and TOKEN not in preview.text


async def test_times_are_labelled_utc(shared_ro: httpx.AsyncClient) -> None:
    page = (await shared_ro.get("/dead")).text
    assert "times in UTC" in page
    # Each time is machine-readable UTC for the script that shows it in the browser's zone.
    stamps = re.findall(r'<time datetime="(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)">([^<]+)</time>', page)
    assert len(stamps) == 3 and all(text == iso[:10] + " " + iso[11:19] for iso, text in stamps)


async def test_a_big_payload_is_cut_with_a_download(ro: httpx.AsyncClient, seeded: Bus) -> None:
    big = "x" * (1024 * 1024 - 100)  # a payload just under the 1 MiB limit
    receipt = await seeded.publish(OrderPlaced(order_id=big))
    page = await ro.get(f"/events/{receipt.event_id}")
    assert page.status_code == 200 and len(page.text) < 200_000
    assert f'href="/events/{receipt.event_id}/payload"' in page.text
    assert "download the raw payload" in page.text
    raw = await ro.get(f"/events/{receipt.event_id}/payload")
    assert raw.status_code == 200 and big in raw.text
    assert raw.headers["content-disposition"].startswith("attachment")
    assert raw.content == (await seeded.event(receipt.event_id)).payload
    small = await ro.get("/events/1")
    assert "download the raw payload" not in small.text


async def _silent_worker(bus: Bus, target: Any) -> str:
    """A worker's row as one killed ten minutes ago leaves it: listener ok, heartbeat old."""
    worker_id = str(uuid.uuid4())
    await bus.backend.deliveries.worker_beat(worker_id)
    if target.kind == "postgres":
        conn = await asyncpg.connect(target.dsn)
        try:
            await conn.execute(
                f"UPDATE \"{target.schema}\".workers SET heartbeat_at = now() - interval '10 minutes', "
                "listener_ok = true WHERE id = $1",
                uuid.UUID(worker_id),
            )
        finally:
            await conn.close()
    else:
        with sqlite3.connect(target.dsn.removeprefix("sqlite:///")) as db:
            db.execute(
                "UPDATE workers SET heartbeat_at = heartbeat_at - 600, listener_ok = 1 WHERE id = ?",
                (worker_id,),
            )
    return worker_id


async def test_a_silent_worker_is_not_shown_as_listening(ro: httpx.AsyncClient, seeded: Bus, target) -> None:
    worker_id = await _silent_worker(seeded, target)
    page = await ro.get("/")
    row = re.search(rf"<tr><td>{worker_id[:8]}</td>.*?</tr>", page.text, re.S)
    assert row is not None, page.text
    assert '<span class="status lost">lost</span>' in row.group(0)
    assert '<span class="status ok">ok</span>' not in row.group(0)
