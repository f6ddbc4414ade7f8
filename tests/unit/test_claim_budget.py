"""How often a worker claims from the start of the pending index, by what that costs."""

from __future__ import annotations

import pytest

from eventbus.router import Router
from eventbus.worker._claims import FULL_SCAN_EVERY, _Active

from ..support.helpers import OrderPlaced


def _active() -> _Active:
    router = Router()
    router.subscribe(OrderPlaced, name="h")(_noop)
    return _Active(router.subscriptions["h"], 1)


async def _noop(event: OrderPlaced, ctx: object) -> None:
    return None


def test_cheap_full_claims_run_every_second_and_top_up_short_claims_soon() -> None:
    active = _active()
    active.look_behind = True
    active.full_scan_ran(10.0, 10.002)  # 2 ms: dead entries are being cleaned away
    assert active.full_scan.due_at == pytest.approx(10.002 + FULL_SCAN_EVERY)
    assert active.full_scan.allowed_at == pytest.approx(10.002 + 20 * 0.002)  # 40 ms on
    assert not active.look_behind


def test_costly_full_claims_are_spaced_by_their_cost() -> None:
    active = _active()
    active.full_scan_ran(10.0, 10.25)  # 250 ms: a held xmin horizon keeps dead entries
    assert active.full_scan.due_at == active.full_scan.allowed_at == pytest.approx(10.25 + 20 * 0.25)
