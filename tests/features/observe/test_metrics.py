"""Prometheus metrics: per-process counters from hooks, queue gauges from one collector."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import anyio
from prometheus_client import generate_latest

from eventbus import Context, RetryPolicy
from eventbus.metrics import Metrics, QueueCollector

from ...conftest import Target
from ...support.helpers import OrderPlaced, Shipped, drain


def _value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics")


async def test_counters_histograms_and_queue_gauges(bus) -> None:
    metrics = Metrics.install(bus)

    @bus.subscribe(OrderPlaced, name="m", retry=RetryPolicy(max_attempts=1))
    async def handle(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id == "bad":
            raise ValueError("no")
        ctx.emit(Shipped(order_id=event.order_id))

    await bus.register()
    await bus.publish(OrderPlaced(order_id="ok"), key="k")
    await bus.publish(OrderPlaced(order_id="ok"), key="k")
    await bus.publish(OrderPlaced(order_id="bad"))
    await drain(bus)
    await bus.publish(OrderPlaced(order_id="later"))
    collector = QueueCollector(bus, registry=metrics.registry)
    await collector.refresh()
    text = generate_latest(metrics.registry).decode()
    kind = bus.backend.kind
    et = "test.order_placed"
    assert _value(text, "eventbus_events_published_total", backend=kind, event_type=et) == 3
    assert _value(text, "eventbus_events_deduplicated_total", backend=kind, event_type=et) == 1
    assert _value(text, "eventbus_events_published_total", event_type="test.shipped") == 1  # a follow-up
    assert _value(text, "eventbus_deliveries_claimed_total", subscription="m") == 2
    assert _value(text, "eventbus_deliveries_finished_total", subscription="m", outcome="completed") == 1
    assert _value(text, "eventbus_deliveries_finished_total", subscription="m", outcome="dead") == 1
    assert _value(text, "eventbus_delivery_duration_seconds_count", subscription="m", outcome="dead") == 1
    assert _value(text, "eventbus_delivery_wait_seconds_count", subscription="m") == 2
    assert _value(text, "eventbus_deliveries_in_flight", subscription="m") == 0
    assert _value(text, "eventbus_subscription_backlog", subscription="m") == 1
    assert _value(text, "eventbus_dead_letters", subscription="m") == 1
    assert _value(text, "eventbus_subscription_lag_seconds", subscription="m") >= 0
    assert "event_id" not in text and "delivery_id" not in text  # never ids as labels
    if kind == "postgres":
        assert _value(text, "eventbus_table_bytes", table="deliveries") > 0
        assert "eventbus_xmin_horizon_age_seconds" in text


def test_worker_serves_metrics_on_localhost(target: Target, tmp_path) -> None:
    env = target.env()
    subprocess.run([sys.executable, "-m", "eventbus", "migrate"], env=env, check=True, capture_output=True)
    port = 19464 if target.kind == "sqlite" else 19465
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventbus",
            "worker",
            "tests.apps.cli_app:bus",
            "--metrics-port",
            str(port),
            "--collect-queues",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = ""
        for _ in range(200):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
                if "eventbus_subscription_backlog" in body:
                    break
            except OSError:
                pass
            anyio.run(anyio.sleep, 0.1)
        assert "eventbus_claims_empty_total" in body and "eventbus_subscription_backlog" in body
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_missing_prometheus_client_is_a_typed_error() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from eventbus import Bus, ExtraNotInstalled\n"
        "from eventbus.metrics import Metrics\n"
        "try:\n    Metrics('sqlite')\nexcept ExtraNotInstalled as e:\n    print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'eventbus[metrics]'" in out.stdout
