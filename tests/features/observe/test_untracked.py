"""Nothing observing deliveries: the worker tracks none of them; a hook added while it runs is told."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from eventbus import Context, Worker
from eventbus.backends.base import ClaimedDelivery
from eventbus.observe import DeliveryOutcome, NoHooks, delivery_context, observes_deliveries

from ...support.helpers import OrderPlaced


class _Recorder(NoHooks):
    def __init__(self) -> None:
        self.claimed: list[str] = []
        self.outcomes: list[tuple[str, str]] = []
        self.told = anyio.Event()

    def on_claim(self, subscription: str, batch: Sequence[ClaimedDelivery], seconds: float) -> None:
        self.claimed += [subscription] * len(batch)

    def on_outcome(self, outcome: DeliveryOutcome) -> None:
        self.outcomes.append((outcome.kind, outcome.subscription))
        self.told.set()


async def test_untracked_without_an_observer_and_a_hook_added_while_running_is_told(bus) -> None:
    logging.getLogger("eventbus.delivery").setLevel(logging.INFO)  # completions not logged
    seen: list[tuple[str, bool, bool]] = []
    recorder = _Recorder()
    worker = Worker(bus, burst=True)

    @bus.subscribe(OrderPlaced, name="untracked")
    async def handle(event: OrderPlaced, ctx: Context) -> None:
        bound = delivery_context()
        tracked = ctx.delivery_id in worker._tracker._tracked
        seen.append((event.order_id, tracked, bound is not None and bound.delivery_id == ctx.delivery_id))
        if event.order_id == "quiet":
            bus.add_hooks(recorder)  # the running worker tells it from its next claim on
            ctx.emit(OrderPlaced(order_id="observed"))

    try:
        assert not observes_deliveries(bus.hooks)
        await bus.publish(OrderPlaced(order_id="quiet"))
        with anyio.fail_after(10):
            await worker.run()
    finally:
        logging.getLogger("eventbus.delivery").setLevel(logging.NOTSET)
    assert seen == [("quiet", False, True), ("observed", True, True)]  # ids bound either way
    assert recorder.claimed == ["untracked"]
    assert recorder.outcomes == [("completed", "untracked")]
