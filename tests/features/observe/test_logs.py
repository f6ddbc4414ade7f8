"""Structured outcome lines, the delivery context in handlers' own logs, the CLI's formats."""

from __future__ import annotations

import io
import json
import logging
import subprocess

from eventbus import Context, DeadLetter, Retry
from eventbus.logs import DeliveryContextFilter, JsonFormatter

from ...conftest import Target
from ...support.cli import run_cli
from ...support.helpers import OrderPlaced, drain

handler_log = logging.getLogger("tests.observe.handler")


def _capture() -> tuple[io.StringIO, logging.Handler]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(DeliveryContextFilter())
    for name in ("eventbus", "tests.observe.handler"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)
    return out, handler


def _release(handler: logging.Handler) -> None:
    for name in ("eventbus", "tests.observe.handler"):
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(logging.NOTSET)


async def test_one_line_per_outcome_with_ids_and_handler_lines_carry_them(bus) -> None:
    @bus.subscribe(OrderPlaced, name="audit")
    async def audit(event: OrderPlaced, ctx: Context) -> None:
        handler_log.info("handling %s", event.order_id)
        if event.order_id == "retry" and ctx.attempt == 1:
            raise Retry(delay=0)
        if event.order_id == "dead":
            raise DeadLetter("secret-free reason")

    out, handler = _capture()
    try:
        ok = await bus.publish(OrderPlaced(order_id="ok", amount_cents=4242))
        await bus.publish(OrderPlaced(order_id="retry"))
        await bus.publish(OrderPlaced(order_id="dead"))
        await drain(bus)
    finally:
        _release(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    # Completions on eventbus.delivery; failed attempts on the worker's rate-limited lines.
    outcomes = [
        r for r in lines if r["logger"] in ("eventbus.delivery", "eventbus.worker") and "outcome" in r
    ]
    by_kind: dict[str, list[dict]] = {}
    for r in outcomes:
        by_kind.setdefault(r["outcome"], []).append(r)
    assert {k: len(v) for k, v in by_kind.items()} == {"completed": 2, "retry": 1, "dead": 1}
    assert [r["level"] for r in by_kind["retry"]] == ["warning"]
    assert [r["level"] for r in by_kind["dead"]] == ["error"]
    assert {r["level"] for r in by_kind["completed"]} == {"debug"}
    first = next(r for r in by_kind["completed"] if r["event_id"] == ok.event_id)
    for field in ("event_type", "delivery_id", "subscription", "attempt", "worker_id", "correlation_id"):
        assert first[field] not in (None, ""), field
    assert first["subscription"] == "audit" and first["correlation_id"] == ok.event_id
    assert first["duration_ms"] >= 0 and first["wait_ms"] >= 0
    dead = by_kind["dead"][0]
    assert dead["error_type"] == "DeadLetter" and "secret-free reason" in dead["error"]
    assert dead["subscription"] == "audit" and dead["attempt"] == 1 and dead["duration_ms"] >= 0
    assert by_kind["retry"][0]["error_type"] == "Retry" and by_kind["retry"][0]["attempt"] == 1
    assert {r["logger"] for r in by_kind["completed"]} == {"eventbus.delivery"}
    own = [r for r in lines if r["logger"] == "tests.observe.handler"]
    assert len(own) == 4
    assert {r["delivery_id"] for r in own} == {r["delivery_id"] for r in outcomes}
    mine = next(r for r in own if r["event_id"] == ok.event_id)
    assert mine["subscription"] == "audit" and mine["attempt"] == 1
    assert "4242" not in out.getvalue()  # never the payload


async def test_nothing_is_bound_outside_a_handler(bus) -> None:
    out, handler = _capture()
    try:
        handler_log.info("outside")
    finally:
        _release(handler)
    (record,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "delivery_id" not in record and record["event"] == "outside"


def _cli(target: Target, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, target.env())


def test_cli_logs_json_when_not_a_terminal_and_text_on_request(target: Target) -> None:
    app = "tests.apps.cli_app:bus"
    assert _cli(target, "migrate").returncode == 0
    assert _cli(target, "worker", app, "--burst").returncode == 0
    _cli(target, "publish", "cli.order", '{"order_id": "fail"}')
    _cli(target, "publish", "cli.order", '{"order_id": "ok"}')
    result = _cli(target, "-v", "worker", app, "--burst")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    outcomes = {r["outcome"]: r for r in records if "outcome" in r}
    assert set(outcomes) == {"completed", "dead"}
    assert outcomes["completed"]["level"] == "info"  # -v raises completions to INFO
    assert outcomes["dead"]["error_type"] == "ValueError"
    assert "postgresql://" not in result.stderr
    _cli(target, "publish", "cli.order", '{"order_id": "fail"}')
    text = _cli(target, "--log-format", "text", "worker", app, "--burst")
    line = next(x for x in text.stderr.splitlines() if "outcome=dead" in x)
    assert "ERROR eventbus.worker" in line and "error_type=ValueError" in line
