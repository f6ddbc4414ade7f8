"""The result path: fencing by (delivery, token), results the database cannot
store, what publish and emit accept, handler cancellation, and failure logs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from decimal import Decimal

import anyio
import pytest

from eventbus import (
    Context,
    EncodeError,
    Envelope,
    InvalidKey,
    PayloadTooLarge,
    RetryPolicy,
    Worker,
)
from eventbus.backends.base import Completion, Failure, OutgoingEvent

from ...support.helpers import OrderPlaced, PaymentRequested, counts, drain
from ...support.processes import EVENTBUS, ProcessGroup

pytestmark = pytest.mark.append_only

WORKER_A = "00000000-0000-4000-8000-00000000000a"
ONCE = RetryPolicy(max_attempts=1)
TWICE = RetryPolicy(max_attempts=2, base_delay_seconds=0.0, jitter=0.0)


async def _taken_over(bus, lease: float = 0.2):
    """One delivery claimed twice: the first lease ran out and was recovered."""
    (old,) = await bus.backend.deliveries.claim(1, 1, lease, WORKER_A)
    await anyio.sleep(lease + 0.1)
    assert await bus.backend.deliveries.recover_expired() == 1
    (new,) = await bus.backend.deliveries.claim(1, 1, 30, WORKER_A)
    assert new.id == old.id and new.lease_token != old.lease_token
    return old, new


async def _wait_for_status(bus, delivery_id: int, statuses: set[str], timeout: float = 20.0):
    with anyio.fail_after(timeout):
        while (detail := await bus.delivery(delivery_id)).status not in statuses:
            await anyio.sleep(0.05)
    return detail


# -- fencing by (delivery, token) -------------------------------------------------


async def test_stale_and_fresh_completion_in_one_batch_commit_only_fresh_follow_ups(bus) -> None:
    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    old, new = await _taken_over(bus)
    stale = Completion(old.id, old.lease_token, (bus.outgoing(PaymentRequested(order_id="stale")),))
    fresh = Completion(new.id, new.lease_token, (bus.outgoing(PaymentRequested(order_id="fresh")),))
    accepted = await bus.backend.deliveries.complete([stale, fresh])
    assert (await bus.status()).events == 2  # the order and the fresh run's follow-up only
    assert accepted == {(new.id, new.lease_token)}


async def test_stale_and_fresh_failure_in_one_batch_record_only_the_fresh_attempt(bus) -> None:
    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    old, new = await _taken_over(bus)

    def failure(lease_token: str, message: str) -> Failure:
        return Failure(old.id, lease_token, False, 0.0, "ValueError", message, "", 0.1, WORKER_A)

    failed = await bus.backend.deliveries.fail(
        [failure(old.lease_token, "stale"), failure(new.lease_token, "fresh")]
    )
    detail = await bus.delivery(new.id)
    assert [(a.error_type, a.message) for a in detail.history] == [
        ("LeaseExpired", "the worker stopped renewing its lease"),
        ("ValueError", "fresh"),
    ]
    assert failed == {(new.id, new.lease_token)}


async def test_refused_stale_result_keeps_the_current_claim_renewed(target, make_bus) -> None:
    """A run that blocked past its lease is re-claimed by the same worker; its
    refused result must not stop the heartbeat of the new run, which outlives
    its own one-second lease several times and then completes."""
    bus = await make_bus()
    second_run = anyio.Event()
    runs: list[int] = []
    ids: list[int] = []

    def recover_elsewhere() -> int:
        """Another worker's sweep, from a thread: this one's loop stays blocked."""

        async def recover() -> int:
            other = target.bus()
            try:
                return await other.backend.deliveries.recover_expired()
            finally:
                await other.aclose()

        recovered: list[int] = []
        thread = threading.Thread(target=lambda: recovered.append(anyio.run(recover)))
        thread.start()
        thread.join()
        return recovered[0]

    @bus.subscribe(OrderPlaced, name="h", lease_seconds=2.0, retry=TWICE)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        runs.append(ctx.attempt)
        ids.append(ctx.delivery_id)
        if ctx.attempt == 1:
            time.sleep(2.3)  # blocks the loop: no renewal, the lease runs out
            assert recover_elsewhere() == 1  # another worker's sweep takes it back
            with anyio.fail_after(10):
                await second_run.wait()
            return  # this run's completion is refused as stale
        second_run.set()
        await anyio.sleep(5.0)  # two and a half leases long: only renewals keep it

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    worker = Worker(bus, poll_interval_seconds=0.1, recovery_interval_seconds=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(20):
            while not ids:
                await anyio.sleep(0.02)
        detail = await _wait_for_status(bus, ids[0], {"completed", "dead"})
        worker.stop()
    assert detail.status == "completed", detail.last_error
    assert runs == [1, 2] and detail.attempts == 2
    assert [a.error_type for a in detail.history] == ["LeaseExpired"]


# -- results the database cannot store ----------------------------------------------


async def test_nul_in_a_handler_error_is_stored_and_the_batch_moves_on(bus) -> None:
    @bus.subscribe(OrderPlaced, name="h", retry=ONCE)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id == "bad":
            raise ValueError("byte \x00 in the message")

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(5)] + [OrderPlaced(order_id="bad")])
    with anyio.fail_after(30):
        await drain(bus)
    assert await counts(bus) == {("h", "completed"): 5, ("h", "dead"): 1}
    (dead,) = await bus.dead_letters()
    assert dead.last_error == "ValueError: byte \\x00 in the message"
    detail = await bus.delivery(dead.id)
    assert "\x00" not in detail.history[0].traceback and "byte \\x00" in detail.history[0].traceback


@pytest.mark.pooler
async def test_a_result_the_database_refuses_fails_alone_and_the_rest_complete(bus) -> None:
    """A follow-up no backend can store (a UUID key, or not an event at all),
    slipped past the checks of ``emit``, fails only its own delivery."""

    @bus.subscribe(OrderPlaced, name="h", retry=TWICE)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id == "uuid-key":
            ctx.follow_ups.append(
                OutgoingEvent("test.payment_requested", b'{"order_id":"x"}', key=uuid.uuid4())  # type: ignore[arg-type]
            )
        elif event.order_id == "not-an-event":
            ctx.follow_ups.append(object())  # type: ignore[arg-type]
        else:
            ctx.emit(PaymentRequested(order_id=event.order_id), key=event.order_id)

    await bus.register()
    orders = [f"o-{i}" for i in range(8)]
    await bus.publish_many(
        [OrderPlaced(order_id=o) for o in [*orders[:4], "uuid-key", *orders[4:], "not-an-event"]]
    )
    with anyio.fail_after(30):
        worker = await drain(bus)
    assert worker.processed == 8
    assert await counts(bus) == {("h", "completed"): 8, ("h", "dead"): 2}
    assert (await bus.status()).events == 10 + 8
    for dead in await bus.dead_letters():
        detail = await bus.delivery(dead.id)
        assert [a.error_type for a in detail.history] == ["ResultNotStored", "ResultNotStored"]
        assert "refused this run's completion" in detail.history[0].message


async def test_publish_and_emit_refuse_keys_the_database_cannot_store(bus) -> None:
    for bad in (5, uuid.uuid4(), "nul\x00key", "\ud800"):
        with pytest.raises(InvalidKey):
            await bus.publish(OrderPlaced(order_id="o"), key=bad)
        with pytest.raises(InvalidKey):
            await bus.publish(OrderPlaced(order_id="o"), ordering_key=bad)
    with pytest.raises(InvalidKey):
        await bus.publish_many([Envelope(OrderPlaced(order_id="o"), key=7)])  # type: ignore[arg-type]
    assert (await bus.status()).events == 0

    raised: list[BaseException] = []

    @bus.subscribe(OrderPlaced, name="h", retry=ONCE)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        try:
            ctx.emit(PaymentRequested(order_id="x"), key=42)  # type: ignore[arg-type]
        except InvalidKey as exc:
            raised.append(exc)
            raise

    await bus.publish(OrderPlaced(order_id="o-1"))
    with anyio.fail_after(30):
        await drain(bus)
    assert len(raised) == 1 and "key must be a str, not int" in str(raised[0])
    (dead,) = await bus.dead_letters()
    assert dead.last_error is not None and dead.last_error.startswith("InvalidKey: key must be a str")


# -- headers --------------------------------------------------------------------------


async def test_headers_are_checked_at_publish(bus) -> None:
    for bad in ({"amount": Decimal("1.5")}, {"n": 1}, {1: "x"}, {"x": "nul\x00"}, {"x": "\ud800"}):
        with pytest.raises(EncodeError):
            await bus.publish(OrderPlaced(order_id="o"), headers=bad)
    assert (await bus.status()).events == 0
    ok = await bus.publish(OrderPlaced(order_id="o"), headers={"trace": "t-1"})
    assert ok.duplicate is False


async def test_an_unencodable_header_in_emit_fails_the_attempt_not_the_worker(bus) -> None:
    @bus.subscribe(OrderPlaced, name="h", retry=ONCE)
    async def h(event: OrderPlaced, ctx: Context) -> None:
        headers = {"amount": Decimal("1.5")} if event.order_id == "bad" else {"amount": "1.5"}
        ctx.emit(PaymentRequested(order_id=event.order_id), headers=headers)  # type: ignore[arg-type]

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=o) for o in ["o-1", "bad", "o-2"]])
    with anyio.fail_after(30):
        await drain(bus)
    assert await counts(bus) == {("h", "completed"): 2, ("h", "dead"): 1}
    (dead,) = await bus.dead_letters()
    assert dead.last_error is not None and dead.last_error.startswith(
        "EncodeError: headers must map str to str"
    )


async def test_headers_count_toward_max_payload_bytes(make_bus) -> None:
    bus = await make_bus(max_payload_bytes=1024)
    await bus.publish(OrderPlaced(order_id="o"), headers={"h": "x" * 900})
    with pytest.raises(PayloadTooLarge, match="payload and headers are"):
        await bus.publish(OrderPlaced(order_id="o"), headers={"h": "x" * 1024})
    with pytest.raises(PayloadTooLarge):
        await bus.publish_many([Envelope(OrderPlaced(order_id="o"), headers={"h": "x" * 2000})])
    assert (await bus.status()).events == 1


# -- a CancelledError out of a handler -------------------------------------------------------


async def test_a_cancelled_error_out_of_a_handler_is_its_failure(bus) -> None:
    fine: list[str] = []

    @bus.subscribe(OrderPlaced, name="cancelled", retry=TWICE)
    async def cancelled(event: OrderPlaced, ctx: Context) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        loop.call_soon(future.cancel)
        await future  # a request some other task cancelled

    @bus.subscribe(OrderPlaced, name="fine")
    async def ok(event: OrderPlaced, ctx: Context) -> None:
        fine.append(event.order_id)

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(3)])
    with anyio.fail_after(30):
        await drain(bus)
    assert sorted(fine) == ["o-0", "o-1", "o-2"]
    assert await counts(bus) == {("cancelled", "dead"): 3, ("fine", "completed"): 3}
    for dead in await bus.dead_letters():
        detail = await bus.delivery(dead.id)
        assert detail.attempts == 2
        assert [a.error_type for a in detail.history] == ["CancelledError", "CancelledError"]


@pytest.mark.pooler
async def test_the_workers_own_stop_is_not_taken_for_a_handler_cancellation(bus) -> None:
    """The grace period ending cancels the handler: that is the stop's doing
    (HandlerInterrupted), never recorded as the handler's CancelledError."""
    started = anyio.Event()
    ids: list[int] = []

    @bus.subscribe(OrderPlaced, name="slow")
    async def slow(event: OrderPlaced, ctx: Context) -> None:
        ids.append(ctx.delivery_id)
        started.set()
        await anyio.sleep(60)

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    worker = Worker(bus, grace_seconds=0.1, poll_interval_seconds=0.1)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await started.wait()
            worker.stop()
    assert await counts(bus) == {("slow", "pending"): 1}
    detail = await bus.delivery(ids[0])
    assert [a.error_type for a in detail.history] == ["HandlerInterrupted"]


async def test_the_worker_process_survives_a_cancelled_error_out_of_a_handler(target, tmp_path) -> None:
    from ...apps.results_app import Cancelled, Fine

    bus = target.bus()
    await bus.migrate()
    group = ProcessGroup(tmp_path)
    try:
        worker = group.spawn(
            [EVENTBUS, "worker", "tests.apps.results_app:bus", "--poll-interval", "0.2"],
            target.env(),
            "worker",
        )
        await bus.publish(Cancelled(n=1))  # a new subscription reads the log: no wait for the worker
        with anyio.fail_after(30):
            while (await counts(bus)).get(("cancelled", "dead"), 0) != 1:
                assert worker.alive(), worker.output()
                await anyio.sleep(0.1)
        await bus.publish(Fine(n=1))
        with anyio.fail_after(30):
            while (await counts(bus)).get(("fine", "completed"), 0) != 1:
                assert worker.alive(), worker.output()
                await anyio.sleep(0.1)
        log = worker.output()
        assert "failed on attempt 1, retrying" in log and "CancelledError" in log
        assert "failed on attempt 2 and is dead: CancelledError" in log
        assert worker.alive()
    finally:
        await group.aclose()
        await bus.aclose()
    assert worker.popen.returncode == 0, worker.output()


# -- failure logs --------------------------------------------------------------------------


async def test_each_failure_is_logged_once_when_the_database_accepts_it(bus, caplog) -> None:
    @bus.subscribe(OrderPlaced, name="flaky", retry=TWICE)
    async def flaky(event: OrderPlaced, ctx: Context) -> None:
        raise ValueError(f"no stock for {event.order_id}")

    await bus.register()
    published = await bus.publish(OrderPlaced(order_id="o-1"))
    caplog.set_level(logging.WARNING, logger="eventbus.worker")
    await drain(bus)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "flaky" in r.getMessage()]
    (dead,) = await bus.dead_letters()
    eid = published.event_id
    assert lines == [
        (
            "WARNING",
            f"subscription 'flaky': delivery {dead.id} (event {eid}) failed on attempt 1, "
            "retrying in 0.0s: ValueError: no stock for o-1",
        ),
        (
            "ERROR",
            f"subscription 'flaky': delivery {dead.id} (event {eid}) failed on attempt 2 "
            "and is dead: ValueError: no stock for o-1",
        ),
    ]


async def test_identical_failures_do_not_flood_the_log(bus, caplog) -> None:
    @bus.subscribe(OrderPlaced, name="broken", retry=ONCE)
    async def broken(event: OrderPlaced, ctx: Context) -> None:
        raise ConnectionError("payment service down")

    await bus.register()
    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(40)])
    caplog.set_level(logging.WARNING, logger="eventbus.worker")
    await drain(bus)
    assert await counts(bus) == {("broken", "dead"): 40}
    messages = [r.getMessage() for r in caplog.records if "'broken'" in r.getMessage()]
    assert len([m for m in messages if "is dead: ConnectionError" in m]) == 5
    assert (
        messages[-1]
        == "subscription 'broken': 35 more ConnectionError failures were not logged (over 5 in 60s)"
    )
    assert len(messages) == 6


# -- publish results -----------------------------------------------------------------------


async def test_publish_many_results_map_to_their_inputs(bus) -> None:
    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await bus.register()
    first = await bus.publish(OrderPlaced(order_id="k-old"), key="k-old")
    batch = [
        Envelope(OrderPlaced(order_id="a")),
        Envelope(OrderPlaced(order_id="k-old-again"), key="k-old"),
        Envelope(OrderPlaced(order_id="b")),
        Envelope(OrderPlaced(order_id="k-new"), key="k-new"),
        Envelope(OrderPlaced(order_id="c")),
        Envelope(OrderPlaced(order_id="k-new-again"), key="k-new"),
        Envelope(OrderPlaced(order_id="d")),
    ]
    results = await bus.publish_many(batch)
    assert [r.duplicate for r in results] == [False, True, False, False, False, True, False]
    assert results[1].event_id == first.event_id and results[5].event_id == results[3].event_id
    new = [r.event_id for r in results if not r.duplicate]
    assert new == sorted(new)  # ids follow input order
    seen: dict[int, str] = {}

    @bus.subscribe(OrderPlaced, name="reader")
    async def reader(event: OrderPlaced, ctx: Context) -> None:
        seen[ctx.event_id] = event.order_id

    await bus.register()  # backfilled from the log
    await drain(bus)
    for envelope, result in zip(batch, results, strict=True):
        assert isinstance(envelope.event, OrderPlaced)
        if not result.duplicate:
            assert seen[result.event_id] == envelope.event.order_id


async def test_a_renewal_racing_a_completion_does_not_report_the_lease_lost(
    bus, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewal reads a run whose completion has committed while the result writer has not
    yet forgotten it: it waits for that write to end instead of calling the lease lost."""
    from eventbus.worker._upkeep import _renew_leases

    @bus.subscribe(OrderPlaced, name="h")
    async def h(event: OrderPlaced, ctx: Context) -> None:
        pass

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    worker = Worker(bus)
    await worker._register()
    claims = worker._claims
    await claims._claim_round(set(claims.active))
    ((_sub, delivery),) = claims.queue.take_all()
    lease = (delivery.id, delivery.lease_token)
    with caplog.at_level(logging.WARNING, logger="eventbus.worker"):
        async with anyio.create_task_group() as tg:
            async with worker._results._lock:  # a write in progress: committed, not yet forgotten
                assert await bus.backend.deliveries.complete(
                    [Completion(delivery.id, delivery.lease_token, (), ())]
                ) == {lease}
                tg.start_soon(_renew_leases, worker)
                await anyio.sleep(0.3)
                claims.forget(lease)
    assert not [r for r in caplog.records if "leases lost" in r.getMessage()]
    assert await counts(bus) == {("h", "completed"): 1}
