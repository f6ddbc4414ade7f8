"""The delivery state machine: handlers, follow-ups, retries, leases."""

from __future__ import annotations

import time

import anyio
import pytest

from eventbus import Context, DeadLetter, Envelope, Retry, RetryPolicy, Worker
from eventbus.backends.base import Completion

from ...support.helpers import FAST, OrderPlaced, PaymentRequested, Shipped, counts, drain

pytestmark = pytest.mark.append_only


@pytest.mark.pooler
async def test_follow_ups_form_a_chain(bus) -> None:
    seen: list[tuple[int, int, int]] = []

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        ctx.emit(PaymentRequested(order_id=event.order_id), key=f"pay:{event.order_id}")

    @bus.subscribe(PaymentRequested, name="ship")
    async def ship(event: PaymentRequested, ctx: Context) -> None:
        ctx.emit(Shipped(order_id=event.order_id), key=f"ship:{event.order_id}")

    @bus.subscribe(Shipped, name="done")
    async def done(event: Shipped, ctx: Context) -> None:
        seen.append((ctx.correlation_id, ctx.event_id, ctx.delivery_id))

    root = await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert len(seen) == 1 and seen[0][0] == root.event_id
    c = await counts(bus)
    assert c == {("charge", "completed"): 1, ("ship", "completed"): 1, ("done", "completed"): 1}
    shipped = await bus.delivery(seen[0][2])
    assert shipped.event_type == "test.shipped"
    assert shipped.correlation_id == root.event_id
    assert shipped.causation_id is not None and shipped.causation_id != root.event_id


async def test_failing_handler_does_not_rerun_others(bus) -> None:
    runs = {"ok1": 0, "ok2": 0, "bad": 0}

    def make(name: str, fail: bool):
        async def handler(event: OrderPlaced, ctx: Context) -> None:
            runs[name] += 1
            if fail:
                raise ValueError("card declined")

        return handler

    bus.subscribe(OrderPlaced, name="ok1")(make("ok1", False))
    bus.subscribe(OrderPlaced, name="ok2")(make("ok2", False))
    bus.subscribe(OrderPlaced, name="bad", retry=FAST)(make("bad", True))
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    assert runs == {"ok1": 1, "ok2": 1, "bad": 3}
    c = await counts(bus)
    assert c[("ok1", "completed")] == 1 and c[("ok2", "completed")] == 1
    assert c[("bad", "dead")] == 1


async def test_retry_then_success_keeps_history(bus) -> None:
    @bus.subscribe(OrderPlaced, name="flaky", retry=FAST)
    async def flaky(event: OrderPlaced, ctx: Context) -> None:
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} failed")

    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    d = await bus.delivery(1)
    assert d.status == "completed" and d.attempts == 3
    assert [a.attempt for a in d.history] == [1, 2]
    assert all(a.error_type == "ConnectionError" for a in d.history)
    assert "attempt 2 failed" in d.history[1].message and "Traceback" in d.history[1].traceback


async def test_handler_signals_retry_and_dead_letter(bus) -> None:
    @bus.subscribe(OrderPlaced, name="retrying", retry=RetryPolicy(max_attempts=5))
    async def retrying(event: OrderPlaced, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise Retry(delay=0)

    @bus.subscribe(OrderPlaced, name="giving-up", retry=RetryPolicy(max_attempts=5))
    async def giving_up(event: OrderPlaced, ctx: Context) -> None:
        raise DeadLetter("order is malformed")

    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    c = await counts(bus)
    assert c == {("retrying", "completed"): 1, ("giving-up", "dead"): 1}
    dead = (await bus.dead_letters())[0]
    assert dead.attempts == 1 and "order is malformed" in (dead.last_error or "")


async def test_non_retryable_exception_goes_straight_to_dead(bus) -> None:
    policy = RetryPolicy(max_attempts=5, base_delay_seconds=0, non_retryable=(KeyError,))

    @bus.subscribe(OrderPlaced, name="strict", retry=policy)
    async def strict(event: OrderPlaced, ctx: Context) -> None:
        raise KeyError("missing")

    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    (dead,) = await bus.dead_letters()
    assert dead.attempts == 1


async def test_undecodable_payload_is_dead_after_one_attempt(bus) -> None:
    handled: list[str] = []

    @bus.subscribe(OrderPlaced, name="h", retry=RetryPolicy(max_attempts=5))
    async def h(event: OrderPlaced, ctx: Context) -> None:
        handled.append(event.order_id)

    await drain(bus)
    await bus.publish_raw("test.order_placed", b'{"order_id": 5}')
    await bus.publish_raw("test.order_placed", b'{"amount_cents": 1}')
    await bus.publish_raw("test.order_placed", b"not json at all")
    await bus.publish(OrderPlaced(order_id="healthy"))
    await drain(bus)
    assert handled == ["healthy"]
    dead = await bus.dead_letters()
    assert len(dead) == 3
    assert all(d.attempts == 1 and (d.last_error or "").startswith("DecodeError") for d in dead)


async def test_handler_timeout_fails_the_attempt(bus) -> None:
    @bus.subscribe(OrderPlaced, name="slow", timeout_seconds=0.1, retry=RetryPolicy(max_attempts=1))
    async def slow(event: OrderPlaced, ctx: Context) -> None:
        await anyio.sleep(5)

    await bus.publish(OrderPlaced(order_id="o-1"))
    with anyio.fail_after(3):
        await drain(bus)
    (dead,) = await bus.dead_letters()
    assert (dead.last_error or "").startswith("HandlerTimeout")


@pytest.mark.pooler
async def test_delayed_event_waits_for_its_time(bus) -> None:
    handled: list[tuple[str, float]] = []

    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        handled.append((event.order_id, time.monotonic()))

    published = time.monotonic()
    # 2 s: the first drain returns well before it even on a busy machine.
    await bus.publish(OrderPlaced(order_id="later"), delay=2.0)
    await drain(bus, wait_for_scheduled=False)
    assert handled == []
    await anyio.sleep(max(0.0, published + 2.1 - time.monotonic()))
    await drain(bus, wait_for_scheduled=False)
    assert [order for order, _ in handled] == ["later"]
    assert handled[0][1] - published >= 2.0


async def test_drain_waits_for_scheduled_retries(bus) -> None:
    attempts: list[int] = []

    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise Retry(delay=0.2)

    await bus.publish(OrderPlaced(order_id="o-1"))
    drained = await drain(bus, timeout=10)
    assert attempts == [1, 2, 3] and drained.processed == 1 and drained.rounds == 3
    await bus.publish(OrderPlaced(order_id="o-2"), delay=5)
    with pytest.raises(TimeoutError):
        await drain(bus, timeout=0.5)


async def test_new_subscription_backfills_unless_latest(bus) -> None:
    await bus.publish(OrderPlaced(order_id="early"))
    got: dict[str, list[str]] = {"earliest": [], "latest": []}

    @bus.subscribe(OrderPlaced, name="earliest")
    async def earliest(event: OrderPlaced, ctx: Context) -> None:
        got["earliest"].append(event.order_id)

    @bus.subscribe(OrderPlaced, name="latest", start_from="latest")
    async def latest(event: OrderPlaced, ctx: Context) -> None:
        got["latest"].append(event.order_id)

    await drain(bus)
    await bus.publish(OrderPlaced(order_id="late"))
    await drain(bus)
    assert got == {"earliest": ["early", "late"], "latest": ["late"]}


@pytest.mark.pooler
async def test_expired_lease_is_recovered_and_completed_once(bus) -> None:
    runs: list[int] = []

    @bus.subscribe(OrderPlaced, name="h", lease_seconds=0.3)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        runs.append(ctx.attempt)

    await drain(bus)
    await bus.publish(OrderPlaced(order_id="o-1"))
    # A worker that claims and then dies: nothing renews the lease.
    (claimed,) = await bus.backend.deliveries.claim(1, 10, 0.3, "00000000-0000-4000-8000-000000000001")
    assert claimed.attempts == 1
    await anyio.sleep(0.5)
    await drain(bus)
    assert runs == [2]
    d = await bus.delivery(claimed.id)
    assert d.status == "completed"
    assert [a.error_type for a in d.history] == ["LeaseExpired"]


async def test_stale_completion_is_rejected_and_its_follow_ups_dropped(bus) -> None:
    @bus.subscribe(OrderPlaced, name="h", lease_seconds=0.2)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await drain(bus)
    await bus.publish(OrderPlaced(order_id="o-1"))
    worker_a = "00000000-0000-4000-8000-00000000000a"
    (old,) = await bus.backend.deliveries.claim(1, 1, 0.2, worker_a)
    await anyio.sleep(0.3)
    assert await bus.backend.deliveries.recover_expired() == 1
    (new,) = await bus.backend.deliveries.claim(1, 1, 30, worker_a)
    assert new.id == old.id and new.lease_token != old.lease_token
    follow = bus.outgoing(PaymentRequested(order_id="o-1"))
    assert await bus.backend.deliveries.complete([Completion(old.id, old.lease_token, (follow,))]) == set()
    assert (await bus.status()).events == 1
    assert await bus.backend.deliveries.complete([Completion(new.id, new.lease_token, (follow,))]) == {
        (new.id, new.lease_token)
    }
    assert (await bus.status()).events == 2


async def test_release_hands_back_without_counting(bus) -> None:
    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await drain(bus)
    await bus.publish(OrderPlaced(order_id="o-1"))
    (claimed,) = await bus.backend.deliveries.claim(1, 1, 30, "00000000-0000-4000-8000-000000000001")
    assert await bus.backend.deliveries.release([claimed.id], claimed.lease_token) == 1
    d = await bus.delivery(claimed.id)
    assert d.status == "pending" and d.attempts == 0


async def test_ordered_subscription_processes_one_per_key(bus) -> None:
    @bus.subscribe(OrderPlaced, name="per-customer", ordered=True)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await drain(bus)
    for i in range(3):
        await bus.publish(OrderPlaced(order_id=f"a{i}"), ordering_key="customer-a")
        await bus.publish(OrderPlaced(order_id=f"b{i}"), ordering_key="customer-b")
    worker = "00000000-0000-4000-8000-000000000001"
    first = await bus.backend.deliveries.claim(1, 10, 30, worker, True)
    assert sorted(d.ordering_key for d in first) == ["customer-a", "customer-b"]
    assert await bus.backend.deliveries.claim(1, 10, 30, worker, True) == []
    await bus.backend.deliveries.complete([Completion(d.id, d.lease_token) for d in first])
    second = await bus.backend.deliveries.claim(1, 10, 30, worker, True)
    assert len(second) == 2
    await bus.backend.deliveries.release([d.id for d in second], second[0].lease_token)
    await drain(bus)
    assert (await counts(bus))[("per-customer", "completed")] == 6


@pytest.mark.pooler
async def test_ordered_key_never_runs_twice_at_once_across_workers(bus) -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    done: list[str] = []

    @bus.subscribe(OrderPlaced, name="pipeline", ordered=True)
    async def pipeline(event: OrderPlaced, ctx: Context) -> None:
        key = event.order_id.split(":")[0]
        if key in running:
            overlaps.append(key)
        running.add(key)
        await anyio.sleep(0.005)
        running.discard(key)
        done.append(event.order_id)

    await drain(bus)
    await bus.publish_many(
        [
            Envelope(OrderPlaced(order_id=f"c{c}:{i}"), ordering_key=f"c{c}")
            for i in range(10)
            for c in range(4)
        ]
    )
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(drain, bus)
    assert overlaps == []
    assert len(done) == 40


@pytest.mark.pooler
async def test_stop_under_load_writes_every_finished_result(bus) -> None:
    handled: list[int] = []
    worker = Worker(bus, concurrency=100, batch_size=100)

    @bus.subscribe(OrderPlaced, name="busy")
    async def busy(event: OrderPlaced, ctx: Context) -> None:
        handled.append(ctx.delivery_id)
        if len(handled) == 1500:
            worker.stop()

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=str(i)) for i in range(3000)])
    with anyio.fail_after(30):
        await worker.run()
    c = await counts(bus)
    assert ("busy", "processing") not in c  # nothing left claimed
    assert c[("busy", "completed")] == len(handled) == len(set(handled))
    assert c[("busy", "completed")] + c[("busy", "pending")] == 3000
