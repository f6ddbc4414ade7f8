"""``eventbus audit`` and the audit rows the command line's actions write (both backends)."""

from __future__ import annotations

import json
import socket
import subprocess

import anyio
import pytest

from eventbus import Context
from eventbus.cli.audit import acting
from eventbus.types import DeliveryFilter

from ..conftest import Target
from ..support.cli import run_cli
from ..support.helpers import OrderPlaced


def _eventbus(target: Target, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, {**target.env(), "EVENTBUS_OPERATOR": "carol"})


async def test_cli_actions_are_audited_and_listed(
    make_bus, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVENTBUS_OPERATOR", "operator-in-test")
    bus = await make_bus()

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.register()
    done = await anyio.to_thread.run_sync(_eventbus, target, "subscriptions", "pause", "charge")
    assert done.returncode == 0, done.stderr
    later = await bus.publish(OrderPlaced(order_id="later"), delay=3600)
    (pending,) = await bus.find_deliveries(DeliveryFilter(event_id=later.event_id))
    await bus.cancel([pending.id], audit=acting())  # as `eventbus cancel` does
    listed = await anyio.to_thread.run_sync(lambda: _eventbus(target, "audit", "--json", "--limit", "5"))
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["action"], r["target"], r["count"], r["actor"], r["interface"]) for r in rows] == [
        ("cancel", f"ids {pending.id}", 1, "operator-in-test", "cli"),
        ("pause", "subscription charge", 1, "carol", "cli"),
    ]
    assert rows[0]["origin"].endswith("@" + socket.gethostname())
    assert [r.id for r in await bus.audit.entries(action="pause", actor="carol")] == [rows[1]["id"]]
