"""The audit trail: rows recorded, read newest first by keyset, filtered, and pruned (every backend)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from eventbus import ConfigurationError, Context, NotFound
from eventbus.audit import Actor
from eventbus.retention import Retention
from eventbus.types import DeliveryFilter

from ...conftest import Target
from ...features.schedules._support import sqlite_path
from ...support.helpers import OrderPlaced


async def _age_audit(target: Target, seconds: float) -> None:
    """Move every audit row ``seconds`` into the past, as time passing would."""
    if target.kind == "postgres":
        conn = await asyncpg.connect(target.direct_dsn)
        try:
            table = f'"{target.schema}".audit_log'
            await conn.execute(f"UPDATE {table} SET at = at - $1 * interval '1 second'", seconds)
        finally:
            await conn.close()
        return
    with sqlite3.connect(sqlite_path(target)) as db:
        db.execute("UPDATE audit_log SET at = at - ?", (seconds,))


async def _record(bus, action: str, actor: str, target: str = "subscription orders") -> int:
    return await bus.audit.record(
        action, target, actor=actor, origin="127.0.0.1", interface="dashboard", count=2, filter="status=dead"
    )


async def test_rows_come_back_newest_first_filtered_and_paged(bus) -> None:
    before = datetime.now(UTC) - timedelta(minutes=5)
    ids = [await _record(bus, a, who) for a, who in [("replay", "ann"), ("purge", "bob"), ("replay", "bob")]]
    assert ids == sorted(ids)
    rows = await bus.audit.entries()
    assert [r.id for r in rows] == ids[::-1]
    newest = rows[0]
    assert (newest.action, newest.actor, newest.origin, newest.target) == (
        "replay", "bob", "127.0.0.1", "subscription orders",
    )  # fmt: skip
    assert (newest.filter, newest.count, newest.interface) == ("status=dead", 2, "dashboard")
    assert newest.at > before
    assert [r.id for r in await bus.audit.entries(action="replay")] == [ids[2], ids[0]]
    assert [r.id for r in await bus.audit.entries(actor="bob")] == [ids[2], ids[1]]
    assert [r.id for r in await bus.audit.entries(action="replay", actor="bob")] == [ids[2]]
    page = await bus.audit.entries(limit=2)
    assert [r.id for r in page] == [ids[2], ids[1]]
    assert [r.id for r in await bus.audit.entries(limit=2, before=page[-1].id)] == [ids[0]]
    # Bad filters are typed errors.
    with pytest.raises(ConfigurationError, match="unknown audit action 'explode'"):
        await bus.audit.entries(action="explode")
    with pytest.raises(ConfigurationError, match="cannot be empty"):
        await bus.audit.entries(actor=" ")
    with pytest.raises(ConfigurationError, match="1 to 1000 rows"):
        await bus.audit.entries(limit=0)
    with pytest.raises(ConfigurationError, match="unknown audit action"):
        await _record(bus, "explode", "ann")
    with pytest.raises(ConfigurationError, match="dashboard or cli"):
        await bus.audit.record("replay", "x", actor="a", origin="b", interface="web")


@pytest.mark.pooler  # the action and its audit row: one transaction of two statements
async def test_a_store_action_records_itself_in_its_own_transaction(bus) -> None:
    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.register()
    later = await bus.publish(OrderPlaced(order_id="later"), delay=3600)
    (pending,) = await bus.find_deliveries(DeliveryFilter(event_id=later.event_id))
    ann = Actor("ann", "10.0.0.7", "dashboard")
    assert await bus.cancel([pending.id, pending.id + 999], audit=ann) == 1
    assert await bus.pause_subscription("charge", audit=ann) is True
    assert await bus.pause_subscription("charge", audit=ann) is False  # recorded, with nothing moved
    assert await bus.remove_subscription("charge", audit=ann) == 0
    with pytest.raises(NotFound):
        await bus.resume_subscription("nosuch", audit=ann)  # refused: its row rolls back with it
    rows = (await bus.audit.entries())[::-1]
    assert [(r.action, r.target, r.count) for r in rows] == [
        ("cancel", f"ids {pending.id}, {pending.id + 999}", 1),
        ("pause", "subscription charge", 1),
        ("pause", "subscription charge", 0),
        ("remove", "subscription charge", 0),
    ]
    assert {(r.actor, r.origin, r.interface) for r in rows} == {("ann", "10.0.0.7", "dashboard")}


@pytest.mark.pooler  # the pruner's lock across batches
async def test_retention_prunes_old_audit_rows(make_bus, target: Target) -> None:
    bus = await make_bus()
    old = [await _record(bus, "cancel", "ann") for _ in range(3)]
    await _age_audit(target, 3 * 86400)
    fresh = await _record(bus, "cancel", "ann")
    two_days = Retention(audit_retention=timedelta(days=2), batch_size=2)
    dry = await bus.prune(dry_run=True, retention=two_days)
    assert dry.audit_rows == 3 and len(await bus.audit.entries()) == 4
    report = await bus.prune(retention=two_days)
    assert report.audit_rows == 3
    assert [r.id for r in await bus.audit.entries()] == [fresh]
    assert fresh not in old
    kept = await bus.prune(retention=Retention(audit_retention=None))
    assert kept.audit_rows == 0 and len(await bus.audit.entries()) == 1
