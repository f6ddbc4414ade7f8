"""Concurrent publishes of one bus share a statement; each caller keeps its own result."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest

from eventbus import BackendError, Bus, Context
from eventbus._coalesce import Flush
from eventbus.backends.base import OutgoingEvent
from eventbus.observe import NoHooks, Publishing
from eventbus.types import PublishResult

from ...conftest import Target
from ...support.helpers import OrderPlaced, drain

# Through PgBouncer too: coalesced publishes share the held connection, and cancellations
# reach a statement in flight.
pytestmark = pytest.mark.pooler


class Recorded:
    """Wraps what the bus publishes through (the coalescer's one-at-a-time call, or the
    plain publish when coalescing is off): which task sent each batch, and its size
    (the database is real)."""

    def __init__(self, bus: Bus) -> None:
        self.calls: list[tuple[asyncio.Task[Any] | None, int]] = []
        name = "publish_serial" if bus.coalescer is not None else "publish"
        self._publish: Flush = getattr(bus.backend.deliveries, name)
        setattr(bus.backend.deliveries, name, self)

    async def __call__(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        self.calls.append((asyncio.current_task(), len(events)))
        return await self._publish(events)

    @property
    def sizes(self) -> list[int]:
        return [size for _, size in self.calls]


async def test_concurrent_publishers_each_get_their_own_id_and_duplicate_flag(bus: Bus) -> None:
    seen: dict[str, int] = {}

    @bus.subscribe(OrderPlaced, name="seen")
    async def record(event: OrderPlaced, ctx: Context) -> None:
        seen[event.order_id] = ctx.event_id

    await bus.register()
    earlier = await bus.publish(OrderPlaced(order_id="taken"), key="taken")
    recorded = Recorded(bus)
    calls: list[tuple[str, str | None]] = [(f"u{i}", None) for i in range(20)]  # unkeyed
    calls += [(f"k{i % 4}-{i}", f"k{i % 4}") for i in range(12)]  # 4 keys, 3 callers each
    calls += [(f"taken-{i}", "taken") for i in range(3)]  # a key taken before
    results = await asyncio.gather(*(bus.publish(OrderPlaced(order_id=o), key=k) for o, k in calls))

    assert recorded.sizes == [1, len(calls) - 1]  # the first went alone, the others together
    await drain(bus)
    by_key: dict[str, list[PublishResult]] = {}
    for (order_id, key), result in zip(calls, results, strict=True):
        if key is None:
            assert not result.duplicate and seen[order_id] == result.event_id
        else:
            by_key.setdefault(key, []).append(result)
    for key, group in by_key.items():
        originals = [r for r in group if not r.duplicate]
        assert len({r.event_id for r in group}) == 1  # every caller of a key gets its one event
        assert len(originals) == (0 if key == "taken" else 1)
    assert by_key["taken"][0].event_id == earlier.event_id
    assert (await bus.status()).events == 1 + 20 + 4
    assert len(seen) == 1 + 20 + 4


async def _refuse_key(target: Target, key: str) -> None:
    """A trigger that makes the database refuse one event (a real refusal, not a mock)."""
    if target.kind == "sqlite":
        with sqlite3.connect(target.dsn.removeprefix("sqlite:///")) as db:
            db.execute(
                f"CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.key = '{key}' "
                "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
            )
        return
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(
            f"""CREATE FUNCTION "{target.schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.key = '{key}' THEN RAISE EXCEPTION 'refused by a trigger'; END IF;
            RETURN NEW; END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON "{target.schema}".events
            FOR EACH ROW EXECUTE FUNCTION "{target.schema}".refuse()"""
        )
    finally:
        await conn.close()


async def test_a_refused_event_fails_only_its_caller(bus: Bus, target: Target) -> None:
    await bus.publish(OrderPlaced(order_id="warm-up"))
    await _refuse_key(target, "bad")
    recorded = Recorded(bus)
    keys = [f"ok-{i}" for i in range(5)] + ["bad"] + [f"ok-{i}" for i in range(5, 10)]
    outcomes = await asyncio.gather(
        *(bus.publish(OrderPlaced(order_id=k), key=k) for k in keys), return_exceptions=True
    )
    for key, outcome in zip(keys, outcomes, strict=True):
        if key == "bad":
            assert isinstance(outcome, BackendError) and "refused by a trigger" in str(outcome)
        else:
            assert isinstance(outcome, PublishResult) and not outcome.duplicate
    # the first alone, the batch of ten refused as a whole, then each of the ten alone
    assert recorded.sizes == [1, 10] + [1] * 10
    assert (await bus.status()).events == 1 + 10


async def test_a_lone_publish_is_sent_at_once_by_its_caller(bus: Bus) -> None:
    recorded = Recorded(bus)
    for i in range(3):
        await bus.publish(OrderPlaced(order_id=str(i)))
    me = asyncio.current_task()
    assert recorded.calls == [(me, 1)] * 3  # no timer, no other task: the caller's own call
    assert bus.coalescer is not None and not bus.coalescer._waiting


async def test_coalescing_can_be_turned_off(make_bus: Callable[..., Awaitable[Bus]]) -> None:
    bus = await make_bus(coalesce_publishes=False)
    assert bus.coalescer is None
    recorded = Recorded(bus)
    results = await asyncio.gather(*(bus.publish(OrderPlaced(order_id=str(i))) for i in range(6)))
    assert recorded.sizes == [1] * 6  # one transaction per call
    assert len({r.event_id for r in results}) == 6


async def test_a_cancelled_waiting_publish_is_not_sent(bus: Bus) -> None:
    recorded = Recorded(bus)
    first = asyncio.ensure_future(bus.publish(OrderPlaced(order_id="first")))
    await asyncio.sleep(0)  # the first is in flight now
    waiting = [asyncio.ensure_future(bus.publish(OrderPlaced(order_id=str(i)))) for i in range(3)]
    await asyncio.sleep(0)
    waiting[1].cancel()
    await first
    done = await asyncio.gather(waiting[0], waiting[2])
    assert recorded.sizes == [1, 2]
    assert len({r.event_id for r in done}) == 2
    assert (await bus.status()).events == 3


@pytest.mark.parametrize("backend_kind", ["postgres"], indirect=True)
async def test_connection_publishes_stay_in_the_callers_transaction(bus: Bus, target: Target) -> None:
    recorded = Recorded(bus)
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await asyncio.gather(
            *(bus.publish(OrderPlaced(order_id=str(i))) for i in range(4)),
            bus.publish(OrderPlaced(order_id="in-tx"), connection=conn),
        )
        await tx.rollback()
    finally:
        await conn.close()
    assert sum(recorded.sizes) == 4  # the connection= publish never joined a batch
    assert (await bus.status()).events == 4  # and it went with the rolled-back transaction


class PerCaller(NoHooks):
    """Records, per publish call, the task it ran in and the results it was told of."""

    def __init__(self) -> None:
        self.seen: list[tuple[asyncio.Task[Any] | None, int, list[PublishResult] | None]] = []

    def on_publish(self, events: Sequence[OutgoingEvent]) -> Publishing:
        task = asyncio.current_task()

        def done(results: Sequence[PublishResult] | None, exc: BaseException | None) -> None:
            self.seen.append((task, len(events), None if results is None else list(results)))

        return events, done


async def test_hooks_see_each_coalesced_publish_in_its_callers_task(bus: Bus) -> None:
    hooks = PerCaller()
    bus.add_hooks(hooks)
    recorded = Recorded(bus)
    tasks = [asyncio.ensure_future(bus.publish(OrderPlaced(order_id=str(i)))) for i in range(5)]
    results = await asyncio.gather(*tasks)
    assert recorded.sizes == [1, 4]  # shared statements ...
    by_task = {task: (size, told) for task, size, told in hooks.seen}
    assert len(hooks.seen) == 5  # ... but one hook call per caller, with that caller's own result
    for task, result in zip(tasks, results, strict=True):
        assert by_task[task] == (1, [result])


class Gated:
    """Holds every batch of more than one event at a gate before it goes to the (real) database."""

    def __init__(self, bus: Bus) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self._publish: Flush = bus.backend.deliveries.publish_serial
        bus.backend.deliveries.publish_serial = self  # type: ignore[method-assign]

        self.then: Callable[[], object] | None = None
        """Called soon after a batch's results are back: after they are set, before their callers run."""

    async def __call__(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        if len(events) > 1:
            self.entered.set()
            await self.gate.wait()
        results = await self._publish(events)
        if len(events) > 1 and self.then is not None:
            asyncio.get_running_loop().call_soon(self.then)
        return results


async def test_a_publish_cancelled_while_its_batch_is_in_flight_is_told_its_result(bus: Bus) -> None:
    gated = Gated(bus)
    first = asyncio.ensure_future(bus.publish(OrderPlaced(order_id="first")))
    await asyncio.sleep(0)  # the first is in flight now
    batch = [asyncio.ensure_future(bus.publish(OrderPlaced(order_id=str(i)))) for i in range(3)]
    await first
    await gated.entered.wait()  # the three are in one statement now
    batch[1].cancel()
    await asyncio.sleep(0)
    gated.gate.set()
    outcomes = await asyncio.gather(*batch, return_exceptions=True)
    told = [o for o in outcomes if isinstance(o, PublishResult)]
    # Published exactly when its caller was told so: a cancelled caller is not left guessing.
    assert (await bus.status()).events == 1 + len(told)
    assert len(told) == 3 and len({r.event_id for r in told}) == 3


async def test_a_publish_cancelled_just_after_its_result_was_set_returns_it(bus: Bus) -> None:
    gated = Gated(bus)
    first = asyncio.ensure_future(bus.publish(OrderPlaced(order_id="first")))
    await asyncio.sleep(0)  # the first is in flight now
    batch = [asyncio.ensure_future(bus.publish(OrderPlaced(order_id=str(i)))) for i in range(2)]
    gated.then = batch[0].cancel  # the result is set; the caller has not run yet
    gated.gate.set()
    await first
    with anyio.fail_after(10):
        outcomes = await asyncio.gather(*batch, return_exceptions=True)
    assert all(isinstance(o, PublishResult) for o in outcomes)
    assert (await bus.status()).events == 3


@pytest.mark.parametrize("backend_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("blocked_first", [True, False], ids=["alone", "in-a-batch"])
async def test_a_key_held_by_an_open_transaction_holds_up_only_its_own_publish(
    bus: Bus, target: Target, blocked_first: bool
) -> None:
    conn = await asyncpg.connect(target.dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        held = await bus.publish(OrderPlaced(order_id="held"), key="k", connection=conn)
        calls = [bus.publish(OrderPlaced(order_id=f"other-{i}")) for i in range(5)]
        calls.insert(0 if blocked_first else 1, bus.publish(OrderPlaced(order_id="again"), key="k"))
        tasks = [asyncio.ensure_future(c) for c in calls]
        blocked = tasks.pop(0 if blocked_first else 1)
        with anyio.fail_after(10):  # while the transaction holding the key is still open
            others = await asyncio.gather(*tasks)
        assert not blocked.done()
        assert len({r.event_id for r in others}) == 5 and not any(r.duplicate for r in others)
        await tx.commit()
        with anyio.fail_after(10):
            again = await blocked
        assert again.duplicate and again.event_id == held.event_id
    finally:
        await conn.close()
    assert (await bus.status()).events == 1 + 5


@pytest.mark.parametrize("backend_kind", ["postgres"], indirect=True)
async def test_the_lock_wait_bound_ends_with_its_statement(bus: Bus, target: Target) -> None:
    db = bus.backend.db  # type: ignore[attr-defined]
    await bus.publish(OrderPlaced(order_id="on the held connection"))
    assert await db.held_conn.fetchval("SHOW lock_timeout") == "0"  # no session state left behind
    conn = await asyncpg.connect(target.dsn)
    try:
        async with conn.transaction():
            await bus.publish(OrderPlaced(order_id="in the caller's transaction"), connection=conn)
            assert await conn.fetchval("SHOW lock_timeout") == "0"  # the caller's settings are its own
    finally:
        await conn.close()


async def test_an_anyio_scope_cancelled_in_flight_gets_the_result_then_the_cancel(bus: Bus) -> None:
    gated = Gated(bus)
    first = asyncio.ensure_future(bus.publish(OrderPlaced(order_id="first")))
    await asyncio.sleep(0)  # the first is in flight now
    scope = anyio.CancelScope()
    steps: list[object] = []

    async def publish_in_scope() -> None:
        with scope:
            steps.append(await bus.publish(OrderPlaced(order_id="scoped")))
            await anyio.lowlevel.checkpoint()  # the cancel lands at this next checkpoint
            steps.append("not cancelled")

    caller = asyncio.ensure_future(publish_in_scope())
    other = asyncio.ensure_future(bus.publish(OrderPlaced(order_id="other")))
    await first
    await gated.entered.wait()  # both in one statement now
    scope.cancel()
    await asyncio.sleep(0)
    gated.gate.set()
    await asyncio.gather(caller, other)
    assert len(steps) == 1 and isinstance(steps[0], PublishResult)
    assert scope.cancelled_caught
    assert (await bus.status()).events == 3
