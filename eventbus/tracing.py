"""OpenTelemetry traces (``pip install 'eventbus[otel]'``), a no-op without the API.

Spans follow the OpenTelemetry messaging conventions (``messaging.system`` =
``eventbus``):

- ``send {event_type}`` (PRODUCER) around each publish; the W3C
  ``traceparent``/``tracestate`` of that span go into every event's headers.
- ``process {event_type}`` (CONSUMER) around each handler: a child of the
  publish on a delivery's first attempt; on a retry (or a lease recovery) a
  new trace *linked* to the publish, as the conventions recommend.
- ``create {event_type}`` (PRODUCER) for each follow-up a handler emits, a
  child of the handler's span, whose context the follow-up carries. So the
  trace tree of a chain is its causation tree, and ``eventbus trace`` shows
  each event's trace id.

Enable with ``Tracing.install(bus)`` (or ``Bus(hooks=[Tracing()])``);
``EVENTBUS_TRACING=off`` turns it off without a code change.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from .backends.base import OutgoingEvent
from .observe import NoHooks, Publishing
from .types import PublishResult

if TYPE_CHECKING:
    from .bus import Bus
    from .context import Context

__all__ = ["Tracing"]

_SYSTEM = "eventbus"


def _load() -> Any:
    if os.environ.get("EVENTBUS_TRACING", "").lower() in ("off", "0", "false"):
        return None
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:
        return None


class Tracing(NoHooks):
    """Hooks that emit messaging spans and carry trace context in event headers."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.trace = _load()
        self.enabled = self.trace is not None
        if self.trace is None:
            return
        self.propagate = importlib.import_module("opentelemetry.propagate")
        self.context = importlib.import_module("opentelemetry.context")
        self.tracer = self.trace.get_tracer("eventbus", tracer_provider=tracer_provider)

    @classmethod
    def install(cls, bus: Bus, tracer_provider: Any = None) -> Tracing:
        """Create the spans' hooks and add them to ``bus`` (nothing when tracing is off or not installed)."""
        tracing = cls(tracer_provider)
        if tracing.enabled:
            bus.add_hooks(tracing)
        return tracing

    def _inject(self, event: OutgoingEvent, ctx: Any) -> OutgoingEvent:
        headers = orjson.loads(event.headers_json) if event.headers_json != "{}" else {}
        self.propagate.inject(headers, context=ctx)
        return msgspec.structs.replace(event, headers_json=orjson.dumps(headers).decode())

    def _attributes(self, operation: str, event_type: str | None) -> dict[str, Any]:
        kind = "send" if operation == "send" else operation
        attrs: dict[str, Any] = {
            "messaging.system": _SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": kind,
        }
        if event_type is not None:
            attrs["messaging.destination.name"] = event_type
        return attrs

    def on_publish(self, events: Sequence[OutgoingEvent]) -> Publishing:
        if not self.enabled or not events:
            return events, None
        types = {e.event_type for e in events}
        event_type = next(iter(types)) if len(types) == 1 else None
        attrs = self._attributes("send", event_type)
        if len(events) > 1:
            attrs["messaging.batch.message_count"] = len(events)
        name = f"send {event_type}" if event_type else "send"
        span = self.tracer.start_span(name, kind=self.trace.SpanKind.PRODUCER, attributes=attrs)
        ctx = self.trace.set_span_in_context(span)
        carried = [e if '"traceparent"' in e.headers_json else self._inject(e, ctx) for e in events]

        def done(results: Sequence[PublishResult] | None, error: BaseException | None) -> None:
            if results and len(results) == 1:
                span.set_attribute("messaging.message.id", str(results[0].event_id))
            if error is not None:
                span.set_attribute("error.type", type(error).__qualname__)
                span.set_status(self.trace.Status(self.trace.StatusCode.ERROR))
            span.end()

        return carried, done

    def on_outgoing(self, event: OutgoingEvent) -> OutgoingEvent:
        """A follow-up emitted by a handler: a ``create`` span under the handler's span."""
        if not self.enabled:
            return event
        attrs = self._attributes("create", event.event_type)
        if event.correlation_id is not None:
            attrs["messaging.message.conversation_id"] = str(event.correlation_id)
        span = self.tracer.start_span(
            f"create {event.event_type}", kind=self.trace.SpanKind.PRODUCER, attributes=attrs
        )
        try:
            return self._inject(event, self.trace.set_span_in_context(span))
        finally:
            span.end()

    def handling(self, ctx: Context) -> contextlib.AbstractContextManager[object]:
        if not self.enabled:
            return contextlib.nullcontext()
        return self._process(ctx)

    @contextlib.contextmanager
    def _process(self, ctx: Context) -> Iterator[None]:
        trace = self.trace
        creation = self.propagate.extract(ctx.headers)
        creation_span = trace.get_current_span(creation).get_span_context()
        links: list[Any] = []
        parent = creation
        if ctx.attempt > 1 or not creation_span.is_valid:
            # A retry is a new trace linked to the publish (it may run much later).
            parent = self.context.Context()
            links = [trace.Link(creation_span)] if creation_span.is_valid else []
        attrs = self._attributes("process", ctx.event_type)
        attrs.update(
            {
                "messaging.message.id": str(ctx.event_id),
                "messaging.message.conversation_id": str(ctx.correlation_id),
                "messaging.destination.subscription.name": ctx.subscription,
                "eventbus.delivery.id": int(ctx.delivery_id),
                "eventbus.delivery.attempt": ctx.attempt,
            }
        )
        with self.tracer.start_as_current_span(
            f"process {ctx.event_type}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes=attrs,
        ) as span:
            try:
                yield
            except Exception as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                raise
