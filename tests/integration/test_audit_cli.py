"""``eventbus audit`` and the audit rows the command line's actions write (both backends)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import anyio

from eventbus import Context
from eventbus.types import DeliveryFilter

from ..conftest import Target
from ..support.helpers import OrderPlaced


def _eventbus(target: Target, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**target.env(), "EVENTBUS_OPERATOR": "carol"}
    cmd = [sys.executable, "-m", "eventbus", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


async def test_cli_actions_are_audited_and_listed(make_bus, target: Target) -> None:
    bus = await make_bus()

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None: ...

    await bus.register()
    later = await bus.publish(OrderPlaced(order_id="later"), delay=3600)
    (pending,) = await bus.find_deliveries(DeliveryFilter(event_id=later.event_id))
    for args in (["subscriptions", "pause", "charge"], ["cancel", str(pending.id)]):
        done = await anyio.to_thread.run_sync(_eventbus, target, *args)
        assert done.returncode == 0, done.stderr
    listed = await anyio.to_thread.run_sync(lambda: _eventbus(target, "audit", "--json", "--limit", "5"))
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["action"], r["target"], r["count"], r["actor"], r["interface"]) for r in rows] == [
        ("cancel", f"ids {pending.id}", 1, "carol", "cli"),
        ("pause", "subscription charge", 1, "carol", "cli"),
    ]
    assert rows[0]["origin"].endswith("@" + socket.gethostname())
    assert [r.id for r in await bus.audit.entries(action="pause", actor="carol")] == [rows[1]["id"]]
