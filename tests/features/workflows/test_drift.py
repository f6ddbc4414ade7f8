"""`workflow check`: live instances against a changed definition, and renamed states."""

from __future__ import annotations

import msgspec

from eventbus import Bus
from eventbus.workflows import Machine, StepContext, Yield

from ...conftest import BusFactory
from ._support import finish, run_until, status_is


class D(msgspec.Struct):
    key: str
    ran: list[str] = []


def version(state: str, **options: object) -> Machine[D]:
    m = Machine("drift", checkpoint=D, key=lambda c: c.key, **options)  # type: ignore[arg-type]

    async def body(c: D, ctx: StepContext) -> Yield | None:
        c.ran.append(ctx.state)
        return Yield() if ctx.state == "OLD" else None

    m.state(initial=True, on_success="DONE", on_failure="DONE", continue_run=False, poll=0.2,
            max_visits=50, name=state)(body)  # fmt: skip
    m.terminal("DONE")
    return m


async def test_check_finds_instances_in_states_that_are_gone_and_renamed_maps_them(
    make_bus: BusFactory,
) -> None:
    old: Bus = await make_bus()
    v1 = version("OLD")
    old.include(v1)
    await old.workflows.start(v1, D(key="d1"))
    await run_until(old, lambda: status_is(old, v1, "d1", "waiting"))
    assert await old.workflows.check(v1) == []

    new: Bus = await make_bus()
    new.include(version("NEW"))
    (problem,) = await new.workflows.check("drift")
    assert "1 waiting instance(s) of drift are in OLD" in problem

    mapped: Bus = await make_bus()
    v3 = version("NEW", renamed={"OLD": "NEW"})
    mapped.include(v3)
    assert await mapped.workflows.check(v3) == []
    await finish(mapped, v3, ["d1"])
    inst = await mapped.workflows.instance(v3, "d1")
    assert inst.state == "DONE" and inst.checkpoint.ran[-1] == "NEW"
