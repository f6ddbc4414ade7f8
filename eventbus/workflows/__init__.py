"""Durable state machines on the bus.

A :class:`Machine` is a state table over a typed checkpoint. Each visit of a
state is one delivery of the machine's internal step event: the pointer is
read from the database, the state function runs once, and its outcome is
committed as one guarded transition (pointer, history row and next step
event together). Nothing is replayed, so there are no determinism rules; a
:class:`Yield` is a commit plus a delayed step event, so a waiting instance
holds no worker and no connection::

    m = Machine("retrain", checkpoint=Retrain, key=lambda c: c.customer)

    @m.state(initial=True, on_success="POLL", on_failure="DONE")
    async def SUBMIT(c: Retrain, ctx: StepContext) -> None:
        c.job_id = await gpu.submit(c.customer, idempotency_key=ctx.op_key)

    @m.state(on_success="DONE", on_failure="POLL", continue_run=False,
             poll=timedelta(minutes=3), max_visits=100)
    async def POLL(c: Retrain, ctx: StepContext) -> Yield | None:
        if await gpu.status(c.job_id) == "running":
            return Yield()

    m.terminal("DONE")
    bus.include(m)
    await bus.workflows.start(m, Retrain(customer="c-42"))
"""

from __future__ import annotations

from ._context import Child, StepContext
from ._diagram import diagram
from ._drift import DefinitionReport, LiveInstances, StateChange, TableChange
from ._machine import (
    BUILT_IN_TERMINALS,
    CANCELLED,
    COMPENSATING,
    FAILED,
    MAX_RETRIES,
    UNCERTAIN,
    Approval,
    Machine,
    State,
)
from ._outcomes import Fail, Goto, Outcome, Uncertain, Yield
from ._workflows import Instance, WorkflowRun, Workflows

__all__ = [
    "BUILT_IN_TERMINALS",
    "CANCELLED",
    "COMPENSATING",
    "FAILED",
    "MAX_RETRIES",
    "UNCERTAIN",
    "Approval",
    "Child",
    "DefinitionReport",
    "Fail",
    "Goto",
    "Instance",
    "LiveInstances",
    "Machine",
    "Outcome",
    "State",
    "StateChange",
    "StepContext",
    "TableChange",
    "Uncertain",
    "WorkflowRun",
    "Workflows",
    "Yield",
    "diagram",
]
