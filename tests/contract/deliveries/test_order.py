"""Ordered subscriptions are FIFO per key (in one process; tests/integration has the processes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from eventbus import Bus, Context, DeadLetter, Envelope, Retry, Worker
from eventbus.backends.base import ClaimedDelivery, Failure
from eventbus.backends.sqlite import _link

from ...support.helpers import OrderPlaced, counts, drain

pytestmark = pytest.mark.append_only

WORKER = "00000000-0000-4000-8000-000000000001"


def _key_seq(event: OrderPlaced) -> tuple[str, int]:
    key, seq = event.order_id.split(":")
    return key, int(seq)


def _steps(key: str, n: int) -> list[Envelope]:
    return [Envelope(OrderPlaced(order_id=f"{key}:{i}"), ordering_key=key) for i in range(n)]


async def _serve_until(worker: Worker, done: Callable[[], bool], timeout: float = 15.0) -> None:
    """Run a long-lived worker until ``done()``, then stop it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(timeout):
            while not done():
                await anyio.sleep(0.01)
        worker.stop()


async def test_a_retry_keeps_its_key_waiting_while_other_keys_flow(bus) -> None:
    handled: list[tuple[str, int, int]] = []

    @bus.subscribe(OrderPlaced, name="fifo", ordered=True)
    async def fifo(event: OrderPlaced, ctx: Context) -> None:
        key, seq = _key_seq(event)
        handled.append((key, seq, ctx.attempt))
        if (key, seq, ctx.attempt) == ("a", 0, 1):
            raise Retry(delay=0.5)

    await bus.register()
    await bus.publish_many(_steps("a", 5) + _steps("b", 5))
    await _serve_until(Worker(bus, poll_interval_seconds=0.2), lambda: len(handled) == 11)
    a = [(seq, attempt) for key, seq, attempt in handled if key == "a"]
    assert a == [(0, 1), (0, 2), (1, 1), (2, 1), (3, 1), (4, 1)]
    assert [seq for key, seq, _ in handled if key == "b"] == [0, 1, 2, 3, 4]
    # b did not wait for a's retry.
    assert handled.index(("b", 4, 1)) < handled.index(("a", 0, 2))


async def test_a_dead_head_lets_its_key_move_on(bus) -> None:
    handled: list[int] = []

    @bus.subscribe(OrderPlaced, name="fifo", ordered=True)
    async def fifo(event: OrderPlaced, ctx: Context) -> None:
        _key, seq = _key_seq(event)
        handled.append(seq)
        if seq == 0:
            raise DeadLetter("poison")

    await bus.register()
    await bus.publish_many(_steps("a", 3))
    await drain(bus)
    assert handled == [0, 1, 2]
    c = await counts(bus)
    assert c[("fifo", "dead")] == 1 and c[("fifo", "completed")] == 2


async def test_publish_many_of_one_key_is_handled_in_input_order(bus) -> None:
    handled: list[int] = []

    @bus.subscribe(OrderPlaced, name="fifo", ordered=True)
    async def fifo(event: OrderPlaced, ctx: Context) -> None:
        handled.append(_key_seq(event)[1])

    await bus.register()
    await bus.publish_many(_steps("a", 20))
    await drain(bus)
    assert handled == list(range(20))


async def test_release_recovery_and_replay_keep_a_deliverys_place(bus) -> None:
    @bus.subscribe(OrderPlaced, name="fifo", ordered=True)
    async def fifo(event: OrderPlaced, ctx: Context) -> None:
        pass

    (sub_id,) = (await bus.register()).values()
    await bus.publish_many(_steps("a", 3))
    (head,) = await bus.backend.deliveries.claim(sub_id, 10, 30, WORKER, True)
    assert await bus.backend.deliveries.claim(sub_id, 10, 30, WORKER, True) == []
    await bus.backend.deliveries.release([head.id], head.lease_token)
    (again,) = await bus.backend.deliveries.claim(sub_id, 10, 0.2, WORKER, True)
    assert again.id == head.id
    await anyio.sleep(0.4)
    assert await bus.backend.deliveries.recover_expired() == 1
    (third,) = await bus.backend.deliveries.claim(sub_id, 10, 30, WORKER, True)
    assert third.id == head.id and third.attempts == 2
    assert await bus.backend.deliveries.fail([_dead(third)]) == {(third.id, third.lease_token)}
    (second,) = await bus.backend.deliveries.claim(sub_id, 10, 30, WORKER, True)  # the key moved on
    assert second.id != head.id
    await bus.backend.deliveries.release([second.id], second.lease_token)
    assert await bus.backend.operate.replay([head.id]) == 1
    (replayed,) = await bus.backend.deliveries.claim(sub_id, 10, 30, WORKER, True)
    assert replayed.id == head.id  # back at its place, before the rest of its key


def _dead(claimed: ClaimedDelivery) -> Failure:
    return Failure(claimed.id, claimed.lease_token, True, 0.0, "Boom", "boom", "", 0.0, WORKER)


async def test_switching_an_ordered_subscription_to_unordered_runs_its_backlog(make_bus) -> None:
    first: Bus = await make_bus()

    @first.subscribe(OrderPlaced, name="flip", ordered=True)
    async def ordered(event: OrderPlaced, ctx: Context) -> None:
        pass

    await first.register()
    await first.publish_many(_steps("a", 3) + _steps("b", 3))
    second: Bus = await make_bus()
    handled: list[str] = []

    @second.subscribe(OrderPlaced, name="flip")
    async def unordered(event: OrderPlaced, ctx: Context) -> None:
        handled.append(event.order_id)

    claims = _count_calls(second.backend.deliveries, "claim")
    with anyio.fail_after(10):
        await drain(second)
    assert sorted(handled) == sorted(f"{k}:{i}" for k in "ab" for i in range(3))
    assert (await counts(second))[("flip", "completed")] == 6
    assert claims() < 10


async def test_switching_an_unordered_subscription_to_ordered_orders_its_backlog(make_bus) -> None:
    first: Bus = await make_bus()

    @first.subscribe(OrderPlaced, name="flip")
    async def unordered(event: OrderPlaced, ctx: Context) -> None:
        pass

    await first.register()
    await first.publish_many(_steps("a", 5) + _steps("b", 5))
    second: Bus = await make_bus()
    handled: list[tuple[str, int]] = []
    running: set[str] = set()
    overlaps: list[str] = []

    @second.subscribe(OrderPlaced, name="flip", ordered=True)
    async def ordered(event: OrderPlaced, ctx: Context) -> None:
        key, seq = _key_seq(event)
        if key in running:
            overlaps.append(key)
        running.add(key)
        await anyio.sleep(0.01)
        running.discard(key)
        handled.append((key, seq))

    with anyio.fail_after(10):
        await drain(second)
    assert overlaps == []
    for key in "ab":
        assert [seq for k, seq in handled if k == key] == list(range(5))


def _count_calls(obj: Any, name: str) -> Callable[[], int]:
    """Count calls of a real method (it still runs); returns a reader of the count."""
    calls = [0]
    real = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(obj, name, counted)
    return lambda: calls[0]


@pytest.mark.pooler
async def test_a_busy_key_does_not_make_the_worker_spin(bus, monkeypatch) -> None:
    started = anyio.Event()
    release = anyio.Event()

    @bus.subscribe(OrderPlaced, name="fifo", ordered=True)
    async def fifo(event: OrderPlaced, ctx: Context) -> None:
        if _key_seq(event)[1] == 0:
            started.set()
            await release.wait()

    await bus.register()
    await bus.publish_many(_steps("a", 5))
    claims = _count_calls(bus.backend.deliveries, "claim")
    writes = [0]
    real_write = _link.write

    def counted_write(*args: Any, **kwargs: Any) -> Any:
        writes[0] += 1
        return real_write(*args, **kwargs)

    monkeypatch.setattr(_link, "write", counted_write)  # SQLite write transactions
    worker = Worker(bus, poll_interval_seconds=5.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            await started.wait()
        await anyio.sleep(0.2)  # start-up sweeps settle
        claims_before, writes_before = claims(), writes[0]
        await anyio.sleep(1.0)  # the key's head runs; its followers wait
        spun_claims, spun_writes = claims() - claims_before, writes[0] - writes_before
        overtaken = (await counts(bus))[("fifo", "completed")]
        release.set()
        with anyio.fail_after(10):
            while (await counts(bus))[("fifo", "completed")] < 5:
                await anyio.sleep(0.02)
        worker.stop()
    assert overtaken == 0  # the key's followers waited for its head
    assert spun_claims <= 3, spun_claims
    assert spun_writes <= 3, spun_writes
