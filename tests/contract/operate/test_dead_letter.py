"""Dead-letter: listing, showing, replaying and purging dead deliveries."""

from __future__ import annotations

import pytest

from eventbus import ConfigurationError, Context, RetryPolicy
from eventbus.types import DeadLetterFilter, DeliveryFilter

from ...support.helpers import OrderPlaced, PaymentRequested, counts, drain


async def _with_dead(bus, n: int = 5) -> dict[str, bool]:
    state = {"broken": True}

    @bus.subscribe(OrderPlaced, name="charge", retry=RetryPolicy(max_attempts=2, base_delay_seconds=0))
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        if state["broken"]:
            raise RuntimeError(f"gateway down for {event.order_id}")
        ctx.emit(PaymentRequested(order_id=event.order_id), key=event.order_id)

    @bus.subscribe(PaymentRequested, name="noop")
    async def noop(event: PaymentRequested, ctx: Context) -> None:
        pass

    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(n)])
    await drain(bus)
    return state


async def test_dead_rows_keep_their_errors(bus) -> None:
    await _with_dead(bus)
    dead = await bus.dead_letters(subscription="charge")
    assert len(dead) == 5
    detail = await bus.delivery(dead[0].id)
    assert detail.status == "dead" and detail.attempts == 2
    assert [a.attempt for a in detail.history] == [1, 2]
    assert "gateway down for o-0" in detail.history[-1].message
    assert detail.last_error == "RuntimeError: gateway down for o-0"
    assert b'"order_id":"o-0"' in detail.payload
    assert await bus.dead_letters(event_type="test.payment_requested") == []


async def test_replay_after_fix_completes_all(bus) -> None:
    state = await _with_dead(bus)
    state["broken"] = False
    assert await bus.replay(DeliveryFilter(status="dead", subscription="charge"), batch_size=2) == 5
    await drain(bus)
    c = await counts(bus)
    assert c[("charge", "completed")] == 5 and c[("noop", "completed")] == 5
    d = await bus.delivery(1)
    assert d.replays == 1 and d.attempts == 1
    assert len(d.history) == 2  # the failures before the replay are kept


async def test_replay_by_id_only_touches_dead_rows(bus) -> None:
    state = await _with_dead(bus, n=2)
    state["broken"] = False
    assert await bus.replay(DeliveryFilter(status="dead", ids=[1])) == 1
    assert await bus.replay(DeliveryFilter(status="dead", ids=[1])) == 0  # now pending, not dead
    await drain(bus)
    c = await counts(bus)
    assert c[("charge", "completed")] == 1 and c[("charge", "dead")] == 1


async def test_purge_deletes_dead_rows_and_history(bus) -> None:
    await _with_dead(bus, n=3)
    assert await bus.purge(DeliveryFilter(status="dead", event_type="test.order_placed")) == 3
    assert await bus.dead_letters() == []
    assert (await bus.status()).events == 3  # the log itself is kept


async def test_the_old_dead_letter_filter_still_replays_with_a_warning(bus) -> None:
    state = await _with_dead(bus, n=2)
    state["broken"] = False
    with pytest.warns(DeprecationWarning, match="DeliveryFilter"):
        flt = DeadLetterFilter(subscription="charge")
    assert flt == DeliveryFilter(status="dead", subscription="charge")
    assert await bus.replay(flt) == 2


async def test_dead_letters_are_the_oldest_first_past_one_page(bus) -> None:
    await _with_dead(bus, n=5)
    dead = await bus.dead_letters(limit=3)
    assert [d.id for d in dead] == sorted(d.id for d in dead) and len(dead) == 3
    everything = await bus.dead_letters()
    assert [d.id for d in everything][:3] == [d.id for d in dead]
    with pytest.raises(ConfigurationError):
        await bus.dead_letters(limit=0)
