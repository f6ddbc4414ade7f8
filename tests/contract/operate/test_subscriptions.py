"""Subscriptions as operators see them: list, pause, resume, remove (both backends)."""

from __future__ import annotations

import logging

import anyio
import pytest

from eventbus import Context, NotFound, RetryPolicy, Worker
from eventbus.backends.base import Failure
from eventbus.types import DeliveryFilter

from ...support.helpers import OrderPlaced, counts, drain

pytestmark = pytest.mark.append_only


def _subscribe(bus, name: str, seen: list[str], fail: bool = False) -> None:
    @bus.subscribe(OrderPlaced, name=name, retry=RetryPolicy(max_attempts=1))
    async def handler(event: OrderPlaced, ctx: Context) -> None:
        seen.append(event.order_id)
        if fail:
            raise RuntimeError("refused")


async def test_paused_subscription_accumulates_and_resumes(bus) -> None:
    seen: list[str] = []
    _subscribe(bus, "charge", seen)
    await drain(bus)
    assert await bus.pause_subscription("charge") is True
    assert await bus.pause_subscription("charge") is False  # guarded: already paused
    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(3)])
    await drain(bus)
    assert seen == []
    (info,) = await bus.list_subscriptions()
    assert (info.name, info.state, info.pending) == ("charge", "paused", 3)
    assert info.lag_seconds is not None and info.lag_seconds >= 0
    assert await bus.resume_subscription("charge") is True
    assert await bus.resume_subscription("charge") is False
    await drain(bus)
    assert sorted(seen) == ["o-0", "o-1", "o-2"]
    assert await counts(bus) == {("charge", "completed"): 3}


@pytest.mark.pooler
async def test_paused_subscription_does_not_spin_a_waiting_worker(bus) -> None:
    seen: list[str] = []
    _subscribe(bus, "charge", seen)
    await drain(bus)
    await bus.pause_subscription("charge")
    await bus.publish(OrderPlaced(order_id="held"))
    claims = 0
    original = bus.backend.deliveries.claim

    async def counting_claim(*args, **kwargs):
        nonlocal claims
        claims += 1
        return await original(*args, **kwargs)

    bus.backend.deliveries.claim = counting_claim
    worker = Worker(bus, poll_interval_seconds=0.2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(1.0)
        worker.stop()
    assert seen == []
    assert claims < 20  # a few polls, not a busy loop on a runnable but paused backlog


async def test_removed_subscription_gets_no_fanout_and_stays_removed(bus, caplog) -> None:
    kept: list[str] = []
    gone: list[str] = []
    _subscribe(bus, "keep", kept)
    _subscribe(bus, "gone", gone, fail=True)
    await bus.publish(OrderPlaced(order_id="dead-one"))
    await drain(bus)  # "gone" fails its only attempt: one dead row
    await bus.pause_subscription("keep")
    await bus.publish_many([OrderPlaced(order_id="p-1"), OrderPlaced(order_id="p-2")])
    assert await bus.remove_subscription("gone") == 2  # its two pending deliveries
    assert await bus.remove_subscription("gone") == 0
    await bus.publish(OrderPlaced(order_id="after"))
    await bus.resume_subscription("keep")
    with caplog.at_level(logging.WARNING, logger="eventbus"):
        await drain(bus)  # the worker still has "gone" in its code: registering keeps it removed
    assert "subscription gone is removed: nothing of it is claimed" in caplog.text
    await bus.publish(OrderPlaced(order_id="later"))
    await drain(bus)
    assert gone == ["dead-one"]
    assert sorted(kept) == ["after", "dead-one", "later", "p-1", "p-2"]
    assert (
        await bus.replay(DeliveryFilter(status="dead", subscription="gone")) == 0
    )  # no worker would take it
    assert await counts(bus) == {
        ("keep", "completed"): 5,
        ("gone", "dead"): 1,
        ("gone", "cancelled"): 2,
    }
    states = {s.name: s.state for s in await bus.list_subscriptions()}
    assert states == {"gone": "removed", "keep": "active"}


async def test_list_reports_when_a_worker_last_served(bus) -> None:
    seen: list[str] = []
    _subscribe(bus, "charge", seen)
    await bus.register()  # a publisher registering is not a worker serving
    (info,) = await bus.list_subscriptions()
    assert info.worker_seen_at is None and info.silent_seconds is None
    await drain(bus)
    (served,) = await bus.list_subscriptions()
    assert served.worker_seen_at is not None and served.silent_seconds is not None
    await anyio.sleep(0.3)
    sub_id = (await bus.register())["charge"]
    await bus.backend.deliveries.worker_beat(
        "00000000-0000-4000-8000-000000000001", subscription_ids=[sub_id]
    )
    (beaten,) = await bus.list_subscriptions()
    assert beaten.worker_seen_at is not None and beaten.worker_seen_at > served.worker_seen_at
    report = await bus.status()
    assert [s.name for s in report.subscriptions] == ["charge"]


async def test_unknown_names_are_not_found(bus) -> None:
    for action in (bus.pause_subscription, bus.resume_subscription, bus.remove_subscription):
        with pytest.raises(NotFound, match="no subscription named 'nope'"):
            await action("nope")


async def test_removing_again_cancels_what_a_running_delivery_left_pending(bus) -> None:
    seen: list[str] = []
    _subscribe(bus, "gone", seen)
    sub_id = (await bus.register())["gone"]
    await bus.publish(OrderPlaced(order_id="running"))
    worker_id = "00000000-0000-4000-8000-000000000002"
    (claimed,) = await bus.backend.deliveries.claim(sub_id, 10, 30.0, worker_id)
    assert await bus.remove_subscription("gone") == 0  # it is processing, not pending
    retry = Failure(claimed.id, claimed.lease_token, False, 0.0, "RuntimeError", "x", "", 0.0, worker_id)
    # back to pending, on a removed subscription
    assert await bus.backend.deliveries.fail([retry]) == {(claimed.id, claimed.lease_token)}
    assert await bus.remove_subscription("gone") == 1
    assert await counts(bus) == {("gone", "cancelled"): 1}
