"""One visit of one state, as one delivery of the machine's step event.

The step handler reads the instance's facts once (pointer, open signals,
approvals and effects of the run, batched with the visits starting
together), refuses a step whose version is not the current one (stale,
duplicated or reordered: a no-op), runs the state function once with no
transaction open, lets the pure decide step (:mod:`._decide`) turn its
outcome into one guarded
:class:`~eventbus.backends.base.WorkflowTransition`, and commits it with the
visits finishing together. Nothing is replayed and nothing recurses: the
next visit is the next delivery.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from ..backends.base import WorkflowFacts, WorkflowStore, WorkflowTransition
from ..context import Context
from ..errors import CheckpointTooLarge, ConfigurationError, InvalidCheckpoint
from ..router import TRANSACTIONAL_TIMEOUT_SECONDS
from ._commits import CommitQueue, LoadQueue
from ._context import Family, StepContext
from ._decide import (
    ACTIVE,
    Compensated,
    Plan,
    Ran,
    RunCompensation,
    RunState,
    TimedOut,
    Writer,
    decide,
    plan,
)  # fmt: skip
from ._machine import COMPENSATING, Machine, StepEvent
from ._outcomes import Fail
from ._wake import wake_cause

__all__ = ["Engine"]

log = logging.getLogger("eventbus.workflows")


class Engine:
    """Runs the visits of one machine: reads through ``store``, commits through ``commits``."""

    def __init__(
        self,
        machine: Machine[Any],
        store: WorkflowStore,
        commits: CommitQueue,
        family: Family | None = None,
        register: Callable[[Sequence[str]], Awaitable[None]] | None = None,
    ) -> None:
        self.m = machine
        self.store = store
        self.commits = commits
        self.family = family
        self._register = register
        self.actor = f"worker:{socket.gethostname()}:{os.getpid()}"
        self.loads = LoadQueue(store, machine.name)
        self._swept_at = -float("inf")

    async def handle(self, step: StepEvent, ctx: Context) -> None:
        """The machine's subscription handler: one visit, or a no-op for a stale step."""
        await self.maybe_sweep()
        facts = await self.loads.load(step.key)
        if facts is None:
            return
        inst = facts.instance
        if inst.version != step.version or inst.status not in ACTIVE:
            return
        by = self._writer(ctx, wake_cause(self.m, step.reason, ctx.attempt, facts))
        planned = plan(self.m, facts, by)
        await self._register_children(planned)
        match planned:
            case RunState() as run if run.state.transactional:
                t, version = await self._visit_in_transaction(facts, run, ctx, by)
            case planned:
                t = await self._visit_planned(facts, planned, ctx, by)
                version = None if t is None else await self.commits.commit(t)
        if t is not None and version is None:
            log.info("visit of %s/%s at version %s was fenced", self.m.name, step.key, step.version)

    async def visit(self, facts: WorkflowFacts, ctx: Context | None) -> WorkflowTransition | None:
        """Plan, run what the plan says, decide: the transition to commit, or None."""
        by = self._writer(ctx)
        planned = plan(self.m, facts, by)
        await self._register_children(planned)
        return await self._visit_planned(facts, planned, ctx, by)

    async def _register_children(self, planned: Plan) -> None:
        """Record the step subscriptions of the child machines a state may start, before it runs.

        So a child's first step fans out to its subscription; done before a
        transactional state opens its transaction (on SQLite the registration
        would wait for the write lock that transaction holds). Once per process.
        """
        if not isinstance(planned, RunState) or not planned.state.children or self._register is None:
            return
        known = self.family.machines if self.family is not None else {}
        names = [name for name in planned.state.children if name in known]
        if names:
            await self._register(names)

    async def _visit_in_transaction(
        self, facts: WorkflowFacts, run: RunState, ctx: Context | None, by: Writer
    ) -> tuple[WorkflowTransition | None, int | None]:
        """Run a transactional state inside the transaction its transition commits in.

        A state that raised, ran past its timeout or left a checkpoint that cannot
        be stored leaves the block without a commit, so its writes roll back; the
        transition of its failure is then committed on its own, as any visit's is.
        """
        own = run.state.timeout  # the state's own timeout, when it has one, ends the visit first
        timeout = TRANSACTIONAL_TIMEOUT_SECONDS if own is None else own
        async with self.store.transaction(timeout + 1.0) as transaction:
            ran = await self._run(facts, run, ctx, transaction.connection, None if own else timeout)
            t = decide(self.m, facts, ran, by)
            if t is not None and ran.checkpoint is not None:  # it ran to the end: its writes stand
                return t, await transaction.commit(t)
        return t, (None if t is None else await self.commits.commit(t))

    async def _visit_planned(
        self, facts: WorkflowFacts, planned: Plan, ctx: Context | None, by: Writer
    ) -> WorkflowTransition | None:
        match planned:
            case RunState() as run:
                return decide(self.m, facts, await self._run(facts, run, ctx), by)
            case RunCompensation() as run:
                return decide(self.m, facts, await self._compensate(facts, run, ctx), by)
            case planned:
                return planned

    def _writer(self, ctx: Context | None, woken_by: str | None = None) -> Writer:
        if ctx is None:
            return Writer(self.actor, woken_by=woken_by)
        return Writer(self.actor, ctx.delivery_id, ctx.lease_token, woken_by)

    async def _run(
        self,
        facts: WorkflowFacts,
        run: RunState,
        ctx: Context | None,
        connection: Any = None,
        timeout_seconds: float | None = None,
    ) -> Ran:
        """Run the state function once; any exception is its outcome (the machine is the boundary).

        A transactional state gets ``connection`` and ``timeout_seconds`` (running past it
        is its :class:`TimeoutError`).
        """
        attempt = ctx.attempt if ctx is not None else 1
        sctx = StepContext(
            facts.instance, run.state.name, run.visit, list(facts.signals), self.m.compensations,
            attempt, run.approval, connection, self.family, facts.children, run.state.children,
        )  # fmt: skip
        started = time.time()
        result: object
        data: bytes | None
        try:
            if timeout_seconds is None:  # no cancel scope of its own on the hot path
                result = await self._call(run, sctx)
            else:
                with anyio.fail_after(timeout_seconds):
                    result = await self._call(run, sctx)
            data = None if isinstance(result, TimedOut) else self.m.encode(run.checkpoint)
        except CheckpointTooLarge as exc:
            result, data = Fail("checkpoint-too-large", str(exc)), None
        except InvalidCheckpoint as exc:
            result, data = Fail("checkpoint-invalid", str(exc)), None
        except Exception as exc:  # the state machine is the error boundary
            result, data = exc, None
        return Ran(run, result, data, started, tuple(sctx.consumed), tuple(sctx.effects), tuple(sctx.starts))

    @staticmethod
    async def _call(run: RunState, sctx: StepContext) -> object:
        """The state function's result, or :class:`TimedOut` when it ran past the state's timeout."""
        limit = run.state.timeout
        if limit is None:
            return await run.state.fn(run.checkpoint, sctx)
        with anyio.move_on_after(limit):
            return await run.state.fn(run.checkpoint, sctx)
        return TimedOut(limit)

    async def _compensate(
        self, facts: WorkflowFacts, run: RunCompensation, ctx: Context | None
    ) -> Compensated:
        """Run the registered compensation of one effect."""
        inst, effect = facts.instance, run.effect
        attempt = ctx.attempt if ctx is not None else 1
        sctx = StepContext(inst, COMPENSATING, run.visit, [], self.m.compensations, attempt)
        started = time.time()
        try:
            fn = self.m.compensations.get(effect.compensation or "")
            if fn is None:
                raise ConfigurationError(f"compensation {effect.compensation!r} is not registered")
            await fn(self.m.decode(inst.checkpoint), effect, sctx)
        except Exception as exc:
            return Compensated(run, exc, started)
        return Compensated(run, None, started)

    async def maybe_sweep(self) -> None:
        """At most once per ``sweep_interval`` in this process (first at its first step):
        re-publish steps of instances whose tick was lost."""
        now = time.monotonic()
        if now - self._swept_at < self.m.sweep_interval:
            return
        self._swept_at = now
        found = await self.store.sweep(self.m.name, self.m.sweep_grace)
        if found:
            log.warning("re-published %d lost steps of %s", found, self.m.name)
