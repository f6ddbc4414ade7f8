"""An application whose machine's table is chosen by ``$DRIFT_SHAPE``, for ``eventbus workflow check``.

``""``: START -> HOLD (yields) -> DONE; ``edges``: HOLD's failure edge goes to
a new RETRY; ``removed``: HOLD is replaced by KEEP; ``renamed``: the same, with
``renamed={"HOLD": "KEEP"}`` declared.
"""

from __future__ import annotations

import os

import msgspec

from eventbus import Bus
from eventbus.workflows import Machine, StepContext, Yield


class Hold(msgspec.Struct):
    key: str


def shaped(change: str) -> Machine[Hold]:
    renamed = {"HOLD": "KEEP"} if change == "renamed" else {}
    m = Machine("shape", checkpoint=Hold, key=lambda c: c.key, renamed=renamed)
    hold = "KEEP" if change in ("removed", "renamed") else "HOLD"

    async def body(c: Hold, ctx: StepContext) -> Yield | None:
        return Yield() if ctx.state == hold else None

    m.state(initial=True, on_success=hold, on_failure="DONE", name="START")(body)
    failure = "RETRY" if change == "edges" else "DONE"
    m.state(on_success="DONE", on_failure=failure, continue_run=False, poll=3600, max_visits=50,
            name=hold)(body)  # fmt: skip
    if change == "edges":
        m.state(on_success=hold, on_failure="DONE", max_visits=3, name="RETRY")(body)
    m.terminal("DONE")
    return m


bus = Bus()
bus.include(shaped(os.environ.get("DRIFT_SHAPE", "")))
