"""Traces: a chain of follow-ups is one trace whose tree is the causation tree."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from eventbus import Context, Retry
from eventbus.tracing import Tracing

from ...support.helpers import OrderPlaced, PaymentRequested, Shipped, drain


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_a_three_step_chain_is_one_trace_with_the_right_parents(bus) -> None:
    provider, exporter = _provider()
    Tracing.install(bus, tracer_provider=provider)

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        ctx.emit(PaymentRequested(order_id=event.order_id))

    @bus.subscribe(PaymentRequested, name="ship")
    async def ship(event: PaymentRequested, ctx: Context) -> None:
        ctx.emit(Shipped(order_id=event.order_id))

    @bus.subscribe(Shipped, name="done")
    async def done(event: Shipped, ctx: Context) -> None:
        pass

    root = await bus.publish(OrderPlaced(order_id="42"))
    await drain(bus)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "send test.order_placed",
        "process test.order_placed",
        "create test.payment_requested",
        "process test.payment_requested",
        "create test.shipped",
        "process test.shipped",
    }
    assert len({s.context.trace_id for s in spans.values()}) == 1
    chain = [
        "send test.order_placed",
        "process test.order_placed",
        "create test.payment_requested",
        "process test.payment_requested",
        "create test.shipped",
        "process test.shipped",
    ]
    assert spans[chain[0]].parent is None
    for parent, child in itertools.pairwise(chain):
        assert _parent(spans[child]) == spans[parent].context.span_id
    send, process = spans["send test.order_placed"], spans["process test.shipped"]
    assert send.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
    assert _attrs(send)["messaging.system"] == "eventbus"
    assert _attrs(send)["messaging.message.id"] == str(root.event_id)
    assert _attrs(process)["messaging.destination.subscription.name"] == "done"
    assert _attrs(process)["messaging.message.conversation_id"] == str(root.event_id)
    # The trace id is visible in the chain.
    tree = await bus.trace(root.event_id)
    assert tree.trace_id == format(send.context.trace_id, "032x")
    assert tree.children[0].children[0].trace_id == tree.trace_id


async def test_a_retry_is_a_new_trace_linked_to_the_publish(bus) -> None:
    provider, exporter = _provider()
    Tracing.install(bus, tracer_provider=provider)

    @bus.subscribe(OrderPlaced, name="flaky")
    async def flaky(event: OrderPlaced, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise Retry(delay=0)

    await bus.publish(OrderPlaced(order_id="1"))
    await drain(bus)
    send = next(s for s in exporter.get_finished_spans() if s.name.startswith("send"))
    first, second = sorted(
        (s for s in exporter.get_finished_spans() if s.name.startswith("process")),
        key=lambda s: int(_attrs(s)["eventbus.delivery.attempt"]),
    )
    assert _parent(first) == send.context.span_id
    assert _attrs(first)["error.type"] == "Retry"
    assert second.parent is None and second.context.trace_id != send.context.trace_id
    assert [link.context.span_id for link in second.links] == [send.context.span_id]


def test_without_opentelemetry_tracing_is_a_no_op() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None; sys.modules['opentelemetry.trace'] = None\n"
        "from eventbus.tracing import Tracing\n"
        "t = Tracing(); print(t.enabled)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
