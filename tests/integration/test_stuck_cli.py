"""``eventbus stuck``: list, retry now, release and cancel from the command line, audited (both backends)."""

from __future__ import annotations

import json
import subprocess

import anyio

from eventbus import Context, RetryPolicy
from eventbus.types import DeliveryFilter

from ..conftest import Target
from ..support.cli import run_cli
from ..support.helpers import OrderPlaced, drain

WORKER_A = "00000000-0000-4000-8000-00000000000a"


def _eventbus(target: Target, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, {**target.env(), "EVENTBUS_OPERATOR": "carol"})


async def _cli(target: Target, *args: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: _eventbus(target, *args))


async def _setup(bus) -> tuple[list[int], int]:
    """Two deliveries waiting to retry and one stuck (claimed by a worker that never reported)."""
    failed: set[str] = set()

    @bus.subscribe(OrderPlaced, name="charge", retry=RetryPolicy(max_attempts=3, base_delay_seconds=3600))
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        if event.order_id not in failed:
            failed.add(event.order_id)
            raise RuntimeError("gateway down")

    await bus.publish_many([OrderPlaced(order_id=f"o-{i}") for i in range(2)])
    await drain(bus, wait_for_scheduled=False)
    await bus.publish(OrderPlaced(order_id="held"))
    (held,) = await bus.backend.deliveries.claim(1, 1, 30, WORKER_A)
    retrying = sorted(r.id for r in await bus.find_deliveries(DeliveryFilter(condition="retrying")))
    return retrying, held.id


async def test_list_retry_now_release_and_cancel(make_bus, target: Target) -> None:
    bus = await make_bus()
    retrying, held = await _setup(bus)
    listed = await _cli(target, "stuck", "list", "--retrying", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["id"] for r in json.loads(listed.stdout)) == retrying
    shown = await _cli(target, "stuck", "list", "--retrying")
    assert "attempt 2 of 3 in" in shown.stdout and shown.stdout.endswith("2 retrying\n")

    done = await _cli(target, "stuck", "retry-now", str(retrying[0]), str(held))
    assert (done.returncode, done.stdout) == (0, "due now: 1 (1 left alone: not in the state expected)\n")
    waiting = await bus.find_deliveries(DeliveryFilter(condition="retrying"))
    assert [r.id for r in waiting] == [retrying[1]]  # the other is due now

    released = await _cli(target, "stuck", "release", str(held))
    assert (released.returncode, released.stdout) == (0, "released: 1\n")
    detail = await bus.delivery(held)
    assert (detail.status, detail.last_error) == ("pending", "Released: released by carol")

    cancelled = await _cli(target, "stuck", "cancel", "--all", "--retrying", "--subscription", "charge")
    assert (cancelled.returncode, cancelled.stdout) == (0, "cancelled: 1\n")
    assert (await bus.delivery(retrying[1])).status == "cancelled"

    rows = [(e.action, e.actor, e.interface, e.count) for e in await bus.audit.entries()]
    assert rows == [
        ("cancel", "carol", "cli", 1), ("release", "carol", "cli", 1), ("retry", "carol", "cli", 1),
    ]  # fmt: skip


async def test_mistakes_are_one_line_and_a_non_zero_exit(make_bus, target: Target) -> None:
    bus = await make_bus()
    await _setup(bus)
    for args, message in [
        (("stuck", "release"), "name delivery IDs or say --all, not both"),
        (("stuck", "release", "1", "--all"), "name delivery IDs or say --all, not both"),
        (("stuck", "cancel", "1", "--subscription", "charge"), "--subscription goes with --all"),
        (("stuck", "retry-now", "--all", "--subscription", "nope"), "no subscription named 'nope'"),
        (("stuck", "release", "1", "--lost-after", "0"), "above 0 and at most a day"),
        (("stuck", "release", "0"), "not an id"),
    ]:
        r = await _cli(target, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert message in r.stderr.strip().splitlines()[-1], (args, r.stderr)
    assert await bus.audit.entries() == []
