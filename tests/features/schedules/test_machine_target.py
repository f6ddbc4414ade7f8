"""A schedule that starts a state machine: one run per occurrence key, checkpoint from the occurrence."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import pytest

from eventbus import InvalidSchedule
from eventbus.testing import drain
from eventbus.workflows import Machine

from ...conftest import BusFactory, Target
from ._support import db_now, rewind


class Report(msgspec.Struct):
    customer: str
    day: str = ""
    steps: int = 0


report = Machine("nightly", checkpoint=Report, key=lambda c: f"{c.customer}@{c.day}")


@report.state(initial=True, on_success="DONE", on_failure="DONE")
async def BUILD(c: Report, ctx: object) -> None:
    c.steps += 1


report.terminal("DONE")


def _checkpoint(scheduled_for: datetime) -> Report:
    return Report(customer="c-42", day=scheduled_for.date().isoformat())


async def test_a_schedule_starts_one_run_per_occurrence(make_bus: BusFactory, target: Target) -> None:
    bus = await make_bus()
    bus.include(report)
    now = await db_now(target)
    bus.schedule(
        "nightly-report",
        start=report,
        checkpoint=_checkpoint,
        every=timedelta(days=1),
        anchor=now - timedelta(hours=1),
        missed="all",
    )
    await bus.schedules.declare()
    await rewind(target, "nightly-report", 2 * 86400)
    report_ = await bus.schedules.tick()
    assert report_.fired == 2  # the two occurrences of the last two days
    assert (await bus.schedules.tick()).fired == 0  # each occurrence fires once
    await drain(bus)
    fired = sorted(
        o.scheduled_for for o in await bus.schedules.occurrences("nightly-report") if o.status == "fired"
    )
    for when in fired:
        inst = await bus.workflows.instance(report, f"c-42@{when.date().isoformat()}")
        assert inst.status == "completed" and inst.state == "DONE"
        assert inst.checkpoint.steps == 1


def test_a_machine_target_is_checked_when_declared() -> None:
    from eventbus import Bus

    bus = Bus("sqlite:///unused.db")
    with pytest.raises(InvalidSchedule, match="checkpoint= must return a Report"):
        bus.schedule("bad", start=report, checkpoint=lambda occ: "nope", every=timedelta(hours=1))
    with pytest.raises(InvalidSchedule, match="start= takes checkpoint="):
        bus.schedule("bad2", start=report, every=timedelta(hours=1))
