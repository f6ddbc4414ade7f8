"""Stuck and retrying deliveries: retry now, release and cancel, guarded and fenced (every backend)."""

from __future__ import annotations

import time

import anyio
import pytest

from eventbus import ConfigurationError, Context, RetryPolicy, Worker
from eventbus.audit import Actor
from eventbus.backends.base import Completion
from eventbus.types import DeliveryFilter

from ...support.helpers import OrderPlaced, drain

pytestmark = pytest.mark.append_only

WORKER_A = "00000000-0000-4000-8000-00000000000a"
ANN = Actor("ann", "10.0.0.7", "dashboard")
SLOW = RetryPolicy(max_attempts=3, base_delay_seconds=3600, jitter=0.0)


async def _retrying(bus, n: int = 2, ran: list[str] | None = None) -> list[int]:
    """``n`` deliveries that failed once and now wait minutes for their next attempt.

    The handler fails the first time; later runs are appended to ``ran``.
    """
    first: set[str] = set()

    @bus.subscribe(OrderPlaced, name="charge", retry=SLOW)
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id not in first:
            first.add(event.order_id)
            raise RuntimeError("gateway down")
        if ran is not None:
            ran.append(event.order_id)

    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(n)])
    await drain(bus, wait_for_scheduled=False)
    rows = await bus.find_deliveries(DeliveryFilter(condition="retrying"))
    return sorted(r.id for r in rows)


async def _claimed(bus, lease_seconds: float = 30.0, *, beat: bool = False):
    """One delivery of "charge" claimed by WORKER_A (a live worker when ``beat``)."""

    @bus.subscribe(OrderPlaced, name="charge", retry=RetryPolicy(max_attempts=2, base_delay_seconds=0))
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    if beat:
        await bus.backend.deliveries.worker_beat(WORKER_A)
    (claimed,) = await bus.backend.deliveries.claim(1, 1, lease_seconds, WORKER_A)
    return claimed


async def test_the_retrying_condition_lists_failed_deliveries_waiting_for_their_next_attempt(bus) -> None:
    ids = await _retrying(bus)
    assert len(ids) == 2
    rows = await bus.find_deliveries(DeliveryFilter(condition="retrying"))
    assert {(r.status, r.attempts, r.max_attempts) for r in rows} == {("pending", 1, 3)}
    assert all(r.lease_until is None for r in rows)
    assert await bus.count_deliveries(DeliveryFilter(condition="retrying", status="pending")) == 2
    assert await bus.count_deliveries(DeliveryFilter(condition="stuck")) == 0
    with pytest.raises(ConfigurationError, match="within status 'pending'"):
        await bus.count_deliveries(DeliveryFilter(condition="retrying", status="dead"))
    with pytest.raises(ConfigurationError, match="stuck or retrying"):
        await bus.count_deliveries(DeliveryFilter(condition="sleepy"))  # type: ignore[arg-type]


@pytest.mark.pooler  # the move, its wake-up and its audit row: one transaction of several statements
async def test_retry_now_makes_a_waiting_delivery_due_and_it_runs(bus) -> None:
    ran: list[str] = []
    ids = await _retrying(bus, ran=ran)
    assert await bus.retry_now([ids[0], 999_999], audit=ANN) == 1
    assert await bus.retry_now([ids[0]]) == 0  # due now: nothing left to hasten
    assert [r.id for r in await bus.find_deliveries(DeliveryFilter(condition="retrying"))] == [ids[1]]
    await drain(bus, wait_for_scheduled=False)
    assert len(ran) == 1
    assert (await bus.delivery(ids[0])).status == "completed"
    assert (await bus.delivery(ids[1])).status == "pending"  # still waiting its hour
    (entry,) = await bus.audit.entries(action="retry")
    assert (entry.actor, entry.target, entry.count) == ("ann", f"ids {ids[0]}, 999999", 1)


async def test_retry_now_by_filter_walks_everything_matching_and_records_one_row(bus) -> None:
    ids = await _retrying(bus, n=3)
    flt = DeliveryFilter(condition="retrying", subscription="charge")
    assert await bus.retry_now(flt, audit=ANN) == 3
    rows = await bus.find_deliveries(DeliveryFilter(ids=ids))
    assert {(r.status, r.attempts) for r in rows} == {("pending", 1)}
    assert await bus.count_deliveries(flt) == 0
    (entry,) = await bus.audit.entries(action="retry")
    assert (entry.target, entry.filter, entry.count) == (
        "deliveries", "condition=retrying, subscription=charge", 3,
    )  # fmt: skip


async def test_retry_now_leaves_every_state_but_waiting_pending_alone(bus) -> None:
    claimed = await _claimed(bus)
    assert await bus.retry_now([claimed.id]) == 0
    assert (await bus.delivery(claimed.id)).status == "processing"


@pytest.mark.pooler  # as above, with the history row
async def test_release_of_a_lost_workers_delivery_counts_the_attempt_and_fences_the_worker(bus) -> None:
    claimed = await _claimed(bus)  # WORKER_A never reported: lost
    (row,) = await bus.find_deliveries(DeliveryFilter(ids=[claimed.id]))
    assert row.status == "processing" and row.worker_id == WORKER_A and row.lease_until is not None
    assert await bus.release_stuck([claimed.id], audit=ANN) == 1
    detail = await bus.delivery(claimed.id)
    assert (detail.status, detail.attempts, detail.lease_until) == ("pending", 1, None)
    assert detail.last_error == "Released: released by ann"
    history = [(a.attempt, a.error_type, a.message) for a in detail.history]
    assert history == [(1, "Released", "released by ann")]
    # The worker was only slow: its completion loses on the token, cleanly.
    assert await bus.backend.deliveries.complete([Completion(claimed.id, claimed.lease_token)]) == set()
    assert (await bus.delivery(claimed.id)).status == "pending"
    (entry,) = await bus.audit.entries(action="release")
    assert (entry.actor, entry.target, entry.count) == ("ann", f"ids {claimed.id}", 1)
    # Claimed again, and released on its last attempt: dead, as a lease recovery does.
    (again,) = await bus.backend.deliveries.claim(1, 1, 30, WORKER_A)
    assert again.attempts == 2
    assert await bus.release_stuck([again.id]) == 1
    dead = await bus.delivery(again.id)
    assert (dead.status, dead.attempts, dead.last_error) == ("dead", 2, "Released: released by an operator")


async def test_release_leaves_a_live_lease_of_a_live_worker_alone(bus) -> None:
    claimed = await _claimed(bus, beat=True)
    assert await bus.release_stuck([claimed.id], audit=ANN) == 0
    assert await bus.cancel([claimed.id], stuck=True) == 0
    assert (await bus.delivery(claimed.id)).status == "processing"
    assert await bus.backend.deliveries.complete([Completion(claimed.id, claimed.lease_token)])
    (entry,) = await bus.audit.entries(action="release")
    assert entry.count == 0


async def test_an_expired_lease_is_stuck_and_released_even_with_its_worker_alive(bus) -> None:
    claimed = await _claimed(bus, lease_seconds=0.05, beat=True)
    await anyio.sleep(0.2)
    stuck = DeliveryFilter(condition="stuck")
    assert [r.id for r in await bus.find_deliveries(stuck)] == [claimed.id]
    assert await bus.count_deliveries(DeliveryFilter(condition="stuck", status="processing")) == 1
    assert await bus.release_stuck(stuck, audit=ANN) == 1
    assert await bus.count_deliveries(stuck) == 0
    (entry,) = await bus.audit.entries(action="release")
    assert (entry.target, entry.filter, entry.count) == ("deliveries", "condition=stuck", 1)


async def test_cancel_of_a_stuck_delivery_fences_its_worker(bus) -> None:
    claimed = await _claimed(bus)
    assert await bus.cancel([claimed.id]) == 0  # pending ones only, unless asked
    assert await bus.cancel([claimed.id], stuck=True, audit=ANN) == 1
    assert (await bus.delivery(claimed.id)).status == "cancelled"
    assert await bus.backend.deliveries.complete([Completion(claimed.id, claimed.lease_token)]) == set()
    assert (await bus.delivery(claimed.id)).status == "cancelled"
    (entry,) = await bus.audit.entries(action="cancel")
    assert (entry.actor, entry.count) == ("ann", 1)


async def test_cancel_of_retrying_deliveries_by_filter(bus) -> None:
    ids = await _retrying(bus, n=2)
    assert await bus.cancel(DeliveryFilter(condition="retrying"), audit=ANN) == 2
    assert {r.status for r in await bus.find_deliveries(DeliveryFilter(ids=ids))} == {"cancelled"}
    (entry,) = await bus.audit.entries(action="cancel")
    assert (entry.filter, entry.count) == ("condition=retrying", 2)


async def test_bad_arguments_are_typed_errors(bus) -> None:
    with pytest.raises(ConfigurationError, match="lost_after_seconds must be positive"):
        await bus.release_stuck([1], lost_after_seconds=0)
    with pytest.raises(ConfigurationError, match="within status 'processing'"):
        await bus.release_stuck(DeliveryFilter(condition="stuck", status="pending"))
    assert await bus.audit.entries() == []


async def test_retry_now_wakes_an_idle_worker_long_before_its_poll(bus) -> None:
    ran: list[str] = []
    (waiting,) = await _retrying(bus, n=1, ran=ran)
    worker = Worker(bus, poll_interval_seconds=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.5)  # idle: the next run is minutes away, the next poll 30 s
        started = time.monotonic()
        assert await bus.retry_now([waiting]) == 1
        with anyio.fail_after(5):
            while not ran:
                await anyio.sleep(0.02)
        woke_after = time.monotonic() - started
        worker.stop()
    assert ran == ["o-0"] and woke_after < 3.0
