"""Fan-out schedules: one occurrence starts a run (or publishes an event) per tenant, keyed per tenant."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta

import asyncpg
import msgspec
import pytest

from eventbus import Bus, Event, InvalidSchedule
from eventbus.errors import FanOutError
from eventbus.fanout import FanOutTarget, spread_offset
from eventbus.testing import drain
from eventbus.types import DeliveryFilter
from eventbus.workflows import Machine

from ...conftest import BusFactory, Target
from ._support import db_now, event_keys, rewind, sqlite_path


class Refresh(msgspec.Struct):
    customer: str
    day: str = ""
    steps: int = 0


refresh = Machine("refresh", checkpoint=Refresh, key=lambda c: c.customer)


@refresh.state(initial=True, on_success="DONE", on_failure="DONE")
async def TRAIN(c: Refresh, ctx: object) -> None:
    c.steps += 1


refresh.terminal("DONE")


class TenantReport(Event, event_type="test.tenant_report"):
    tenant: str
    scheduled_for: datetime | None = None


def _checkpoint(tenant: str, scheduled_for: datetime) -> Refresh:
    return Refresh(customer=tenant, day=scheduled_for.date().isoformat())


async def _make_due(target: Target, delivery_id: int) -> None:
    """Bring a retry's run time forward to its last change, as if its backoff had passed."""
    query = f"UPDATE deliveries SET run_at = updated_at WHERE id = {int(delivery_id)}"
    if target.kind == "sqlite":
        with sqlite3.connect(sqlite_path(target)) as db:
            db.execute(query)
        return
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(f'SET search_path TO "{target.schema}"')
        await conn.execute(query)
    finally:
        await conn.close()


async def _fire(bus: Bus, target: Target, name: str) -> datetime:
    """Record the schedules, make ``name``'s next occurrence due, tick; the occurrence's time."""
    await bus.schedules.declare()
    await rewind(target, name, 86400)
    assert (await bus.schedules.tick()).fired == 1
    (fired,) = [o for o in await bus.schedules.occurrences(name) if o.status == "fired"]
    return fired.scheduled_for


async def test_one_occurrence_starts_one_run_per_tenant_and_never_twice(
    make_bus: BusFactory, target: Target
) -> None:
    bus = await make_bus()
    bus.include(refresh)

    async def customers() -> list[str]:
        return ["acme", "globex", "initech"]

    now = await db_now(target)
    daily = timedelta(days=1)
    bus.schedule(
        "refresh-all", start=refresh, checkpoint=_checkpoint, every=daily, anchor=now, for_each=customers
    )
    when = await _fire(bus, target, "refresh-all")
    await drain(bus)
    for customer in ("acme", "globex", "initech"):
        inst = await bus.workflows.instance(refresh, customer)
        assert inst.status == "completed" and inst.checkpoint == Refresh(customer, when.date().isoformat(), 1)
    keys = await event_keys(target, "wf.start.refresh")
    assert keys == [f"refresh-all@{when.isoformat()}/{c}" for c in ("acme", "globex", "initech")]

    # The same occurrence fanned out again (as a re-run after a crash would) starts nothing twice.
    fan_out = bus.schedules.declared["refresh-all"].target
    assert isinstance(fan_out, FanOutTarget)
    await bus.publish(fan_out.event_class(scheduled_for=when), key="once-more")
    await drain(bus)
    assert len(await event_keys(target, "wf.start.refresh")) == 3
    assert (await bus.workflows.instance(refresh, "acme")).run_id == 1


async def test_an_event_per_tenant_spread_over_the_window_at_the_schedule_s_priority(
    make_bus: BusFactory, target: Target
) -> None:
    bus = await make_bus()
    bus.pull.subscription(TenantReport, name="reports")
    await bus.register()
    tenants = [f"t-{i:03}" for i in range(40)]
    now = await db_now(target)
    hourly = timedelta(hours=1)
    bus.schedule(
        "reports", TenantReport, every=hourly, anchor=now, for_each=lambda: tenants, spread=600, priority=3
    )
    when = await _fire(bus, target, "reports")
    await drain(bus, wait_for_scheduled=False)
    rows = [r for r in await bus.find_deliveries(limit=100) if r.subscription == "reports"]
    assert sorted(r.key or "" for r in rows) == [f"reports@{when.isoformat()}/{t}" for t in tenants]
    for r in rows:
        offset = spread_offset("reports", (r.key or "").rsplit("/", 1)[1], 600)
        assert abs((r.run_at - r.created_at).total_seconds() - offset) < 1.0  # the tenant's own offset
    assert max(r.run_at for r in rows) - min(r.run_at for r in rows) > timedelta(minutes=5)
    assert {(await bus.delivery(r.id)).priority for r in rows} == {3}
    async with bus.pull.claim("reports", limit=100) as batch:  # the ones whose offset has come
        assert all(isinstance(d.event, TenantReport) and d.event.scheduled_for == when for d in batch)


async def test_a_failing_lister_starts_nothing_and_its_occurrence_is_retried(
    make_bus: BusFactory, target: Target
) -> None:
    bus = await make_bus()
    bus.pull.subscription(TenantReport, name="reports")
    await bus.register()
    answers: list[object] = [ConnectionError("tenant database down"), ["a", 7], ["a", "b"]]

    def tenants() -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    now = await db_now(target)
    bus.schedule("reports", TenantReport, every=timedelta(hours=1), anchor=now, for_each=tenants)
    await _fire(bus, target, "reports")
    await drain(bus, wait_for_scheduled=False)
    (fan_out,) = await bus.find_deliveries()
    detail = await bus.delivery(fan_out.id)
    assert detail.status == "pending" and detail.history[0].error_type == FanOutError.__qualname__
    assert "tenant database down" in detail.history[0].message
    assert await event_keys(target, "test.tenant_report") == []  # nothing half-started

    await _make_due(target, fan_out.id)  # its backoff (seconds) passed
    await drain(bus, wait_for_scheduled=False)
    (dead,) = await bus.dead_letters(subscription="schedule.reports")  # bad tenants: dead at once
    assert (await bus.delivery(dead.id)).history[-1].error_type == InvalidSchedule.__qualname__
    assert await event_keys(target, "test.tenant_report") == []

    # The lister is fixed: the occurrence's fan-out is replayed from the dead letters.
    assert await bus.replay(DeliveryFilter(ids=[dead.id])) == 1
    await drain(bus, wait_for_scheduled=False)
    assert len(await event_keys(target, "test.tenant_report")) == 2


def test_a_fan_out_is_checked_when_declared() -> None:
    bus = Bus("sqlite:///unused.db")
    hourly = timedelta(hours=1)
    for options, message in (
        ({"for_each": ["a"]}, "for_each= takes a function"),
        ({"for_each": list, "spread": -1}, "spread= is a finite number"),
        ({"spread": 60}, "spread= spreads a fan-out"),
    ):
        with pytest.raises(InvalidSchedule, match=message):
            bus.schedule("bad", TenantReport, every=hourly, **options)

    class NoTenant(Event, event_type="test.no_tenant"):
        region: str = "eu"

    with pytest.raises(InvalidSchedule, match="needs a `tenant: str` field"):
        bus.schedule("bad", NoTenant, every=hourly, for_each=list)
    with pytest.raises(InvalidSchedule, match="name uses letters, digits"):
        bus.schedule("bad name", TenantReport, every=hourly, for_each=list)
    with pytest.raises(InvalidSchedule, match="checkpoint= must return a Refresh"):
        bus.schedule(
            "bad", start=refresh, checkpoint=lambda tenant, when: tenant, every=hourly, for_each=list
        )
    assert "bad" not in bus.declared_schedules and not bus.subscriptions
