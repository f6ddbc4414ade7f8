"""The richer `eventbus status`: every event type, each subscription's queue, storage health."""

from __future__ import annotations

import json
import subprocess

import asyncpg

from eventbus import Context, Event, RetryPolicy

from ...conftest import Target
from ...support.cli import run_cli
from ...support.helpers import OrderPlaced, drain


class Orphan(Event, event_type="test.orphan"):
    n: int


class Waiting(Event, event_type="test.waiting"):
    n: int


def _app(bus) -> None:
    @bus.subscribe(OrderPlaced, name="orders", retry=RetryPolicy(max_attempts=1))
    async def orders(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id == "bad":
            raise ValueError("bad order")

    @bus.subscribe(Waiting, name="waiting")
    async def waiting(event: Waiting, ctx: Context) -> None:
        raise AssertionError("not run in this test")


async def test_status_shows_unhandled_types_backlog_lag_dead_and_recent(bus) -> None:
    _app(bus)
    await bus.register()
    await bus.publish_many([Orphan(n=1), Orphan(n=2)])  # nothing handles this type
    await bus.publish(OrderPlaced(order_id="ok"))
    await bus.publish(OrderPlaced(order_id="bad"))
    await drain(bus, subscriptions=["orders"])
    await bus.publish(Waiting(n=1))
    await bus.publish(Waiting(n=2), delay=3600)
    report = await bus.status()
    types = {t.event_type: t for t in report.event_types}
    assert types["test.orphan"].events == 2 and types["test.orphan"].subscriptions == 0
    assert types["test.order_placed"].events == 2 and types["test.order_placed"].subscriptions == 1
    assert not any(t.events_capped for t in report.event_types)
    subs = {s.name: s for s in report.queues}
    assert subs["orders"].dead == 1 and subs["orders"].completed_last_hour == 1
    assert subs["orders"].backlog == 0 and subs["orders"].lag_seconds is None
    assert subs["waiting"].backlog == 1 and subs["waiting"].scheduled == 1
    assert subs["waiting"].lag_seconds is not None and subs["waiting"].lag_seconds >= 0
    assert subs["waiting"].in_flight == 0 and subs["waiting"].stuck == 0
    assert not subs["orders"].completed_last_hour_capped
    assert report.events == 6 and report.rows  # the existing fields are kept


async def test_stuck_deliveries_are_counted(bus) -> None:
    _app(bus)
    ids = await bus.register()
    await bus.publish(Waiting(n=1))
    claimed = await bus.backend.deliveries.claim(
        ids["waiting"], 10, 0.01, "00000000-0000-0000-0000-000000000001"
    )
    assert len(claimed) == 1
    import anyio

    await anyio.sleep(0.05)
    (sub,) = [s for s in (await bus.status()).queues if s.name == "waiting"]
    assert sub.in_flight == 1 and sub.stuck == 1


async def test_postgres_status_shows_tables_and_the_xmin_holder(pg_target) -> None:
    bus = pg_target.bus()
    await bus.migrate()
    holder = await asyncpg.connect(pg_target.dsn, server_settings={"application_name": "held-open"})
    try:
        _app(bus)
        await bus.register()
        await bus.publish(OrderPlaced(order_id="ok"))
        tx = holder.transaction(isolation="repeatable_read")
        await tx.start()
        await holder.fetchval("SELECT 1")
        report = await bus.status()
        names = {t.table for t in report.tables}
        assert {"events", "deliveries", "delivery_attempts", "maintenance"} <= names
        assert all(t.total_bytes > 0 for t in report.tables)
        assert report.horizon is not None
        # Other sessions share this server; the oldest holder is ours or older than ours.
        pid = await holder.fetchval("SELECT pg_backend_pid()")
        if report.horizon.pid == pid:
            assert report.horizon.application_name == "held-open"
            assert report.horizon.state == "idle in transaction"
        await tx.rollback()
    finally:
        await holder.close()
        await bus.aclose()


def test_status_command_text(target: Target) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(args, target.env())

    assert cli("migrate").returncode == 0
    assert cli("publish", "nobody.handles", '{"a": 1}').returncode == 0
    out = cli("status")
    assert out.returncode == 0, out.stderr
    assert any(
        line.startswith("nobody.handles") and "0 (unhandled)" in line for line in out.stdout.splitlines()
    )
    assert "last prune: never" in out.stdout
    data = json.loads(cli("status", "--json").stdout)
    assert data["event_types"] == [
        {
            "event_type": "nobody.handles",
            "events": 1,
            "events_capped": False,
            "subscriptions": 0,
            "versions": {"1": 1},
        }
    ]
