"""Pull claims: code that is not a handler claims deliveries and settles them itself (``bus.pull``).

The claims go through the same store calls as a worker's, so the tests check
the same outcomes: attempts, retries by the policy, dead letters, fencing.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from eventbus import Bus, ConfigurationError, Context, DeadLetter, NotFound, Retry, RetryPolicy
from eventbus.errors import DuplicateSubscription
from eventbus.pull import ClaimFailed

from ...conftest import BusFactory
from ...support.helpers import FAST, OrderPlaced, PaymentRequested, counts, drain

pytestmark = pytest.mark.append_only


async def _publish(bus: Bus, n: int) -> list[int]:
    return [(await bus.publish(OrderPlaced(order_id=f"o-{i}"))).event_id for i in range(n)]


async def test_claim_yields_decoded_events_and_complete_publishes_follow_ups(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")

    @bus.subscribe(PaymentRequested, name="pay")
    async def pay(event: PaymentRequested, ctx: Context) -> None:
        return None

    await bus.register()
    ids = await _publish(bus, 3)
    async with bus.pull.claim("agent", limit=2, lease_seconds=30) as batch:
        assert len(batch) == 2
        assert [d.event_id for d in batch] == ids[:2]
        assert [d.event for d in batch] == [OrderPlaced(order_id="o-0"), OrderPlaced(order_id="o-1")]
        assert all(isinstance(d.event, OrderPlaced) and d.attempt == 1 for d in batch)
        assert len({d.lease_token for d in batch}) == 1
        assert await batch[0].complete(follow_ups=[PaymentRequested(order_id="o-0")])
        assert await batch[1].complete()
        assert await batch[1].complete() is False  # settles once
    c = await counts(bus)
    assert c[("agent", "completed")] == 2 and c[("agent", "pending")] == 1
    assert c[("pay", "pending")] == 1
    (follow_up,) = [r for r in await bus.find_deliveries() if r.subscription == "pay"]
    detail = await bus.delivery(follow_up.id)
    assert detail.causation_id == ids[0] and detail.correlation_id == ids[0]


async def test_fail_retries_by_the_policy_then_dead(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent", retry=FAST)  # 3 attempts, no delay
    await bus.register()
    await _publish(bus, 1)
    for attempt in (1, 2):
        async with bus.pull.claim("agent") as batch:
            (d,) = batch
            assert d.attempt == attempt
            assert await d.fail("model timed out")
        assert (await counts(bus))[("agent", "pending")] == 1
    async with bus.pull.claim("agent") as batch:
        (d,) = batch
        assert d.attempt == 3
        assert await d.fail(ValueError("still broken"))
    (dead,) = await bus.dead_letters(subscription="agent")
    detail = await bus.delivery(dead.id)
    assert [a.error_type for a in detail.history] == [ClaimFailed.__qualname__] * 2 + ["ValueError"]
    assert detail.attempts == 3 and detail.history[0].message == "model timed out"
    async with bus.pull.claim("agent") as batch:
        assert len(batch) == 0


async def test_fail_without_retry_or_with_dead_letter_is_dead_at_once(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent", retry=FAST)
    await bus.register()
    await _publish(bus, 2)
    async with bus.pull.claim("agent") as batch:
        assert await batch[0].fail("bad input", retry=False)
        assert await batch[1].fail(DeadLetter("unusable"))
    assert (await counts(bus))[("agent", "dead")] == 2


async def test_a_retry_error_picks_its_delay(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent", retry=FAST)
    await bus.register()
    await _publish(bus, 1)
    async with bus.pull.claim("agent") as batch:
        assert await batch[0].fail(Retry(delay=60))
    async with bus.pull.claim("agent") as batch:
        assert len(batch) == 0  # not due for a minute
    assert (await counts(bus))[("agent", "pending")] == 1


async def test_release_hands_back_without_counting_the_attempt(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")
    await bus.register()
    await _publish(bus, 1)
    async with bus.pull.claim("agent") as batch:
        assert await batch[0].release()
        assert await batch[0].complete() is False
    async with bus.pull.claim("agent") as batch:
        (d,) = batch
        assert d.attempt == 1
        assert await d.complete()
    assert (await counts(bus))[("agent", "completed")] == 1


async def test_leaving_the_block_releases_what_was_not_settled(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")
    await bus.register()
    await _publish(bus, 3)
    with pytest.raises(RuntimeError, match="crashed"):
        async with bus.pull.claim("agent", limit=3) as batch:
            assert await batch[0].complete()
            raise RuntimeError("crashed")
    assert (await counts(bus))[("agent", "pending")] == 2
    with anyio.move_on_after(5) as scope:
        async with bus.pull.claim("agent", limit=3) as batch:
            assert len(batch) == 2
            scope.cancel()
            await anyio.sleep(10)
    assert scope.cancelled_caught
    async with bus.pull.claim("agent", limit=3) as batch:
        assert [d.attempt for d in batch] == [1, 1]  # released: the attempts were not counted
    c = await counts(bus)
    assert c[("agent", "pending")] == 2 and c[("agent", "completed")] == 1


async def test_extend_keeps_the_lease_and_a_late_complete_is_fenced(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")
    await bus.register()
    await _publish(bus, 2)
    async with bus.pull.claim("agent", limit=2, lease_seconds=0.3) as batch:
        kept, lost = batch
        assert await kept.extend(30)
        await anyio.sleep(0.5)
        assert await bus.backend.deliveries.recover_expired() == 1  # only the one not extended
        assert await lost.complete(follow_ups=[PaymentRequested(order_id="late")]) is False
        assert await lost.extend() is False
        assert await kept.complete()
    c = await counts(bus)
    assert c[("agent", "completed")] == 1 and c[("agent", "pending")] == 1
    assert await bus.count_deliveries() == 2  # the refused completion published nothing
    async with bus.pull.claim("agent") as batch:
        (again,) = batch
        assert again.event_id == lost.event_id and again.attempt == 2
        assert again.lease_token != lost.lease_token


async def test_a_worker_does_not_serve_a_subscription_without_a_handler(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")
    ran: list[str] = []

    @bus.subscribe(OrderPlaced, name="pushed")
    async def pushed(event: OrderPlaced, ctx: Context) -> None:
        ran.append(event.order_id)

    await bus.register()
    await _publish(bus, 1)
    await drain(bus)
    c = await counts(bus)
    assert ran == ["o-0"] and c[("pushed", "completed")] == 1
    assert c[("agent", "pending")] == 1


async def test_bad_input_gets_typed_errors(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")

    @bus.subscribe(OrderPlaced, name="pushed")
    async def pushed(event: OrderPlaced, ctx: Context) -> None:
        return None

    with pytest.raises(DuplicateSubscription):
        bus.pull.subscription(OrderPlaced, name="agent")
    with pytest.raises(ConfigurationError):
        bus.pull.subscription(OrderPlaced, name="")
    with pytest.raises(ConfigurationError):
        bus.pull.subscription(OrderPlaced, name="x", lease_seconds=0)
    with pytest.raises(NotFound):
        async with bus.pull.claim("nobody"):
            pass
    with pytest.raises(ConfigurationError, match="handler"):
        async with bus.pull.claim("pushed"):
            pass
    for limit in (0, 1001, True):
        with pytest.raises(ConfigurationError):
            async with bus.pull.claim("agent", limit=limit):
                pass
    with pytest.raises(ConfigurationError):
        async with bus.pull.claim("agent", lease_seconds=-1):
            pass
    await _publish(bus, 1)
    async with bus.pull.claim("agent") as batch:
        with pytest.raises(ConfigurationError):
            await batch[0].complete(follow_ups=["not an event"])  # type: ignore[list-item]
        with pytest.raises(ConfigurationError):
            await batch[0].extend(0)
        assert await batch[0].complete()  # a refused call settled nothing


async def test_the_policy_from_max_attempts(bus: Bus) -> None:
    sub = bus.pull.subscription(OrderPlaced, name="agent", max_attempts=1, retry=RetryPolicy(jitter=0.0))
    assert sub.retry.max_attempts == 1 and sub.handler is None
    await bus.register()
    await _publish(bus, 1)
    async with bus.pull.claim(sub) as batch:
        assert await batch[0].fail("once only")
    assert (await counts(bus))[("agent", "dead")] == 1


async def test_a_paused_subscription_hands_out_nothing(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")
    await bus.register()
    await _publish(bus, 1)
    assert await bus.pause_subscription("agent")
    async with bus.pull.claim("agent") as batch:
        assert len(batch) == 0
    assert await bus.resume_subscription("agent")
    async with bus.pull.claim("agent") as batch:
        assert len(batch) == 1 and await batch[0].complete()


async def test_take_leaves_the_claim_to_whoever_holds_the_token(bus: Bus, make_bus: BusFactory) -> None:
    bus.pull.subscription(OrderPlaced, name="agent", retry=FAST)
    await bus.register()
    ids = await _publish(bus, 3)
    batch = await bus.pull.take("agent", limit=2, lease_seconds=60)
    assert [d.event_id for d in batch] == ids[:2]
    claimed, token = [d.id for d in batch], batch[0].lease_token
    del batch  # this process is done with it: nothing hands the deliveries back
    assert (await counts(bus))[("agent", "processing")] == 2

    other = await make_bus()  # another process, knowing only the ids and the token
    other.pull.subscription(OrderPlaced, name="agent", retry=FAST)
    stranger = await other.pull.held(claimed[0], str(uuid.uuid4()))
    assert await stranger.complete() is False  # not held under that token: fenced
    first = await other.pull.held(claimed[0], token)
    assert first.event == OrderPlaced(order_id="o-0") and first.attempt == 1
    assert await first.complete(follow_ups=[PaymentRequested(order_id="o-0")])
    assert await first.complete() is False  # settles once, as in the claiming process
    assert await (await other.pull.held(claimed[1], token)).fail("later")
    c = await counts(bus)
    assert c[("agent", "completed")] == 1 and c[("agent", "pending")] == 2
    detail = await bus.delivery(claimed[1])
    assert detail.attempts == 1 and detail.history[0].message == "later"


async def test_held_refuses_what_it_cannot_name(bus: Bus) -> None:
    bus.pull.subscription(OrderPlaced, name="agent")

    @bus.subscribe(PaymentRequested, name="pay")
    async def pay(event: PaymentRequested, ctx: Context) -> None:
        return None

    await bus.register()
    await _publish(bus, 1)
    await bus.publish(PaymentRequested(order_id="o-0"))
    token = (await bus.pull.take("agent")).deliveries[0].lease_token
    with pytest.raises(ConfigurationError, match="is not a lease token"):
        await bus.pull.held(1, "not-a-token")
    with pytest.raises(NotFound, match="no delivery 999"):
        await bus.pull.held(999, token)
    (paid,) = [r for r in await bus.find_deliveries() if r.subscription == "pay"]
    with pytest.raises(ConfigurationError, match="has a handler"):
        await bus.pull.held(paid.id, token)
