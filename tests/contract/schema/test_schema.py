"""Opening a bus never migrates behind the user's back."""

from __future__ import annotations

import pytest

from eventbus import SchemaNotMigrated

from ...conftest import Target
from ...support.helpers import OrderPlaced

# Through PgBouncer too: migrations take a transaction-scoped lock, the check opens a pooled connection.
pytestmark = pytest.mark.pooler


async def test_unmigrated_bus_refuses_with_the_command_to_run(target: Target) -> None:
    bus = target.bus()
    try:
        with pytest.raises(SchemaNotMigrated, match="eventbus migrate"):
            await bus.publish(OrderPlaced(order_id="o-1"))
        applied = await bus.migrate()
        assert applied and applied[0] == "0001_create_events.sql"
        assert (await bus.publish(OrderPlaced(order_id="o-1"))).duplicate is False
        assert await bus.migrate() == []
    finally:
        await bus.aclose()


async def test_bus_migrates_when_asked(target: Target) -> None:
    async with target.bus(migrate=True) as bus:
        assert (await bus.publish(OrderPlaced(order_id="o-1"))).duplicate is False
        assert await bus.migrate() == []
