"""One reading of an event's trace id, for the backends' chains and the dashboard."""

from __future__ import annotations

from eventbus.types import trace_id_of

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_an_explicit_trace_id_header_wins() -> None:
    assert trace_id_of({"trace_id": "abc", "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}) == "abc"


def test_a_w3c_traceparent_gives_its_trace_id() -> None:
    assert trace_id_of({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}) == TRACE


def test_anything_else_gives_none() -> None:
    assert trace_id_of({}) is None
    assert trace_id_of({"trace_id": ""}) is None
    assert trace_id_of({"traceparent": "a-b-c-d"}) is None
    assert trace_id_of({"traceparent": f"00-{TRACE.upper()}-00f067aa0ba902b7-01"}) is None
    assert trace_id_of({"traceparent": f"00-{TRACE}-01"}) is None
