"""Stuck and retrying deliveries on the dashboard: what each row shows, the lists, and the actions."""

from __future__ import annotations

import re
from typing import Any

import anyio
import httpx

from eventbus import Bus
from eventbus.backends.base import Completion, Failure
from eventbus.types import DeliveryFilter

from ...support.helpers import OrderPlaced
from .conftest import OPERATOR, ORIGIN, TOKEN, unlock

WORKER = "00000000-0000-4000-8000-0000000000b1"


def _post(client: httpx.AsyncClient, url: str, data: Any) -> Any:
    return client.post(url, data=data, headers={"Origin": ORIGIN})


async def _claimed(bus: Bus, order_id: str, lease_seconds: float = 30.0):
    """A fresh delivery of "charge", claimed by WORKER."""
    await bus.publish(OrderPlaced(order_id=order_id))
    sub = (await bus.register())["charge"]
    (claimed,) = await bus.backend.deliveries.claim(sub, 1, lease_seconds, WORKER)
    return claimed


async def _retrying(bus: Bus, order_id: str = "slow") -> int:
    """A delivery of "charge" that failed once and waits an hour for its second (and last) attempt."""
    c = await _claimed(bus, order_id)
    failure = Failure(c.id, c.lease_token, False, 3600, "RuntimeError", "later", "", 0.1, WORKER)
    assert await bus.backend.deliveries.fail([failure])
    return int(c.id)


async def _expired(bus: Bus, *order_ids: str) -> list[int]:
    """Deliveries of "charge" whose lease ran out under a live worker."""
    await bus.backend.deliveries.worker_beat(WORKER)
    ids = [int((await _claimed(bus, o, lease_seconds=0.05)).id) for o in order_ids]
    await anyio.sleep(0.2)
    return ids


async def test_rows_show_their_lease_worker_and_next_attempt(ro: httpx.AsyncClient, seeded: Bus) -> None:
    retrying = await _retrying(seeded)
    page = await ro.get("/deliveries?condition=retrying")
    assert page.status_code == 200
    row = re.search(rf'title="delivery {retrying}".*?</tr>', page.text, re.S)
    assert row is not None, page.text
    assert re.search(
        r"next attempt at <time datetime=\"[\dT:Z-]+\">[\d-]+ [\d:]+</time>"
        r" \(in (59|60) min\), attempt 2 of 2",
        row.group(0),
    )
    held = await _claimed(seeded, "held")  # WORKER never reported: lost
    page = await ro.get("/deliveries?status=processing")
    row = re.search(rf'title="delivery {held.id}".*?</tr>', page.text, re.S)
    assert row is not None, page.text
    assert re.search(r"lease ends in (29|30) s", row.group(0))
    assert f"worker {WORKER[:8]} (no longer reporting)" in row.group(0)
    assert '<span class="status lost">lost</span>' in row.group(0)
    await seeded.backend.deliveries.worker_beat(WORKER)  # now it reports: host and pid, not lost
    single = await ro.get(f"/deliveries/{held.id}")
    assert re.search(rf"worker {WORKER[:8]} [^<]+/\d+", single.text)
    assert 'class="status lost"' not in single.text and "Running under a live lease" in single.text
    assert (await ro.get("/deliveries/999999")).status_code == 404
    assert (await ro.get("/deliveries?condition=sleepy")).status_code == 400


async def test_the_overview_stuck_count_links_to_the_stuck_list(ro: httpx.AsyncClient, seeded: Bus) -> None:
    (stuck,) = await _expired(seeded, "stuck-1")
    overview = await ro.get("/")
    link = re.search(r'<a href="(/deliveries\?condition=stuck&amp;subscription=charge)">1</a>', overview.text)
    assert link is not None, overview.text
    listed = await ro.get(link.group(1).replace("&amp;", "&"))
    assert re.findall(r'<td class="num did">(\d+)</td>', listed.text) == [str(stuck)]
    assert re.search(r"lease expired \d+ s ago", listed.text)
    assert '<strong id="count">1</strong>' in listed.text


async def test_retry_now_from_the_delivery_page_is_confirmed_and_audited(
    rw: httpx.AsyncClient, seeded: Bus
) -> None:
    retrying = await _retrying(seeded)
    csrf = await unlock(rw)
    page = await rw.get(f"/deliveries/{retrying}")
    assert 'value="retry">Retry now…' in page.text and 'value="release"' not in page.text
    form = {"csrf": csrf, "ids": str(retrying), "back": "delivery", "op": "retry"}
    preview = await _post(rw, "/deliveries/action", form)
    assert preview.status_code == 200 and '<strong id="preview-count">1</strong>' in preview.text
    assert "Confirm: retry now" in preview.text
    waiting = DeliveryFilter(condition="retrying")
    assert await seeded.count_deliveries(waiting) == 1, "the preview changes nothing"
    done = await _post(rw, "/deliveries/action", {**form, "confirm": "yes"})
    assert done.status_code == 303
    assert done.headers["location"] == f"/deliveries/{retrying}?flash=stuck-retry&n=1"
    assert await seeded.count_deliveries(DeliveryFilter(condition="retrying")) == 0
    assert (await seeded.delivery(retrying)).status == "pending"
    (entry,) = await seeded.audit.entries(action="retry")
    assert (entry.actor, entry.target, entry.count, entry.interface) == (
        OPERATOR, f"ids {retrying}", 1, "dashboard",
    )  # fmt: skip
    again = await _post(rw, "/deliveries/action", {**form, "confirm": "yes"})
    assert again.headers["location"].endswith("n=0")  # due now: nothing left to hasten


async def test_release_everything_stuck_by_the_filter(rw: httpx.AsyncClient, seeded: Bus) -> None:
    ids = await _expired(seeded, "s-1", "s-2")
    csrf = await unlock(rw)
    page = await rw.get("/deliveries?condition=stuck")
    assert 'value="release">Release all matching…' in page.text
    form = {"csrf": csrf, "scope": "filter", "condition": "stuck", "op": "release"}
    preview = await _post(rw, "/deliveries/action", form)
    assert '<strong id="preview-count">2</strong>' in preview.text and "condition=stuck" in preview.text
    assert "The attempt each was on counts" in preview.text
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', preview.text))
    assert hidden["scope"] == "filter" and hidden["confirm"] == "yes" and hidden["condition"] == "stuck"
    done = await _post(rw, "/deliveries/action", {**hidden, "csrf": csrf})
    assert done.headers["location"] == "/deliveries?condition=stuck&flash=stuck-release&n=2"
    rows = await seeded.find_deliveries(DeliveryFilter(ids=ids))
    assert {(r.status, r.attempts, r.last_error) for r in rows} == {
        ("pending", 1, f"Released: released by {OPERATOR}")
    }
    (entry,) = await seeded.audit.entries(action="release")
    assert (entry.target, entry.filter, entry.count) == ("deliveries", "condition=stuck", 2)


async def test_cancel_a_stuck_delivery_and_its_worker_loses(rw: httpx.AsyncClient, seeded: Bus) -> None:
    held = await _claimed(seeded, "held")  # its worker never reported: lost, so stuck
    csrf = await unlock(rw)
    page = await rw.get(f"/deliveries/{held.id}")
    assert 'value="release">Release…' in page.text and 'value="cancel" class="danger">Cancel…' in page.text
    form = {"csrf": csrf, "ids": str(held.id), "op": "cancel", "confirm": "yes"}
    assert (await _post(rw, "/deliveries/action", form)).status_code == 303
    assert (await seeded.delivery(held.id)).status == "cancelled"
    assert await seeded.backend.deliveries.complete([Completion(held.id, held.lease_token)]) == set()
    (entry,) = await seeded.audit.entries(action="cancel")
    assert (entry.actor, entry.count) == (OPERATOR, 1)


async def test_actions_are_guarded_and_checked(
    rw: httpx.AsyncClient, ro: httpx.AsyncClient, seeded: Bus
) -> None:
    retrying = await _retrying(seeded)
    form = {"ids": str(retrying), "op": "retry", "confirm": "yes", "token": TOKEN}
    assert (await _post(ro, "/deliveries/action", form)).status_code == 403  # read-only
    assert (await _post(rw, "/deliveries/action", {**form, "token": "wrong"})).status_code == 403
    bare = await rw.post("/deliveries/action", data=form)  # no Origin
    assert bare.status_code == 403
    assert (await _post(rw, "/deliveries/action", {**form, "op": "explode"})).status_code == 400
    whole = {"scope": "filter", "op": "cancel", "confirm": "yes", "token": TOKEN}
    refused = await _post(rw, "/deliveries/action", whole)
    assert refused.status_code == 400 and "stuck or retrying list" in refused.text
    mismatched = await _post(rw, "/deliveries/action", {**whole, "op": "release", "condition": "retrying"})
    assert mismatched.status_code == 400 and "release acts on the stuck list" in mismatched.text
    assert await seeded.count_deliveries(DeliveryFilter(condition="retrying")) == 1
    assert await seeded.audit.entries() == []
