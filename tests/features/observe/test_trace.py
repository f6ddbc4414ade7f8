"""`Bus.trace` and `eventbus trace`: the causation tree of a chain, with each delivery's outcome."""

from __future__ import annotations

import json
import subprocess

import pytest

from eventbus import Context, NotFound, RetryPolicy
from eventbus.types import ChainEvent

from ...conftest import Target
from ...support.cli import run_cli
from ...support.helpers import OrderPlaced, PaymentRequested, Shipped, drain


def _chain_app(bus) -> None:
    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        ctx.emit(PaymentRequested(order_id=event.order_id), key=f"pay:{event.order_id}")
        ctx.emit(Shipped(order_id=event.order_id))

    @bus.subscribe(PaymentRequested, name="ship")
    async def ship(event: PaymentRequested, ctx: Context) -> None:
        ctx.emit(Shipped(order_id=event.order_id), key=f"ship:{event.order_id}")

    @bus.subscribe(Shipped, name="notify", retry=RetryPolicy(max_attempts=2, base_delay_seconds=0, jitter=0))
    async def notify(event: Shipped, ctx: Context) -> None:
        if ctx.key is None:
            raise ValueError("no mail for an unkeyed shipment")


def _flatten(e: ChainEvent) -> list[ChainEvent]:
    return [e, *(x for c in e.children for x in _flatten(c))]


async def test_trace_is_the_causation_tree_from_any_member(bus) -> None:
    _chain_app(bus)
    root = await bus.publish(OrderPlaced(order_id="42"), key="order-42")
    other = await bus.publish(OrderPlaced(order_id="43"))
    await drain(bus)
    tree = await bus.trace(root.event_id)
    assert tree.id == root.event_id and tree.key == "order-42" and tree.causation_id is None
    assert [d.subscription for d in tree.deliveries] == ["charge"]
    assert tree.deliveries[0].status == "completed" and tree.deliveries[0].elapsed_seconds is not None
    kids = {c.event_type: c for c in tree.children}
    assert set(kids) == {"test.payment_requested", "test.shipped"}
    unkeyed = kids["test.shipped"]
    (failed,) = unkeyed.deliveries
    assert failed.status == "dead" and failed.attempts == 2
    assert failed.last_error and failed.last_error.startswith("ValueError: no mail")
    assert failed.last_attempt_seconds is not None
    (grandchild,) = kids["test.payment_requested"].children
    assert grandchild.key == "ship:42" and grandchild.deliveries[0].status == "completed"
    assert grandchild.causation_id == kids["test.payment_requested"].id
    members = _flatten(tree)
    assert len(members) == 4 and {m.correlation_id for m in members} == {root.event_id}
    assert other.event_id not in {m.id for m in members}
    # Asked from a leaf, the answer is the same whole tree.
    assert await bus.trace(grandchild.id) == tree
    with pytest.raises(NotFound):
        await bus.trace(10**9)


def _cli(target: Target, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, target.env())


async def test_trace_command_text_json_and_errors(make_bus, target: Target) -> None:
    bus = await make_bus()
    _chain_app(bus)
    root = await bus.publish(OrderPlaced(order_id="42"), key="order-42")
    await drain(bus)
    await bus.aclose()
    out = _cli(target, "trace", str(root.event_id))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"event {root.event_id} test.order_placed key=order-42"
    assert any("charge: completed" in x for x in lines)
    assert any("notify: dead" in x and "last error: ValueError: no mail" in x for x in lines)
    assert sum("test.shipped" in x for x in lines) == 2
    data = json.loads(_cli(target, "trace", str(root.event_id), "--json").stdout)
    assert data["id"] == root.event_id and len(data["children"]) == 2
    missing = _cli(target, "trace", "999999")
    assert missing.returncode != 0 and missing.stderr.strip().count("\n") == 0
    assert "NotFound: no event 999999" in missing.stderr
    bad = _cli(target, "trace", "abc")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


async def test_a_chain_reads_the_trace_id_header_as_the_dashboard_does(bus) -> None:
    """One reading of the trace id: an explicit ``trace_id`` header counts in the chain too."""
    sent = await bus.publish(OrderPlaced(order_id="o-t"), headers={"trace_id": "t-42"})
    root = await bus.trace(sent.event_id)
    assert root.trace_id == "t-42"
