"""The workflow port on PostgreSQL: every write is one transaction, guarded by the version read."""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import asyncpg
import orjson

from ...types import (
    WorkflowApprovalRow,
    WorkflowChildRow,
    WorkflowDefinitionRow,
    WorkflowEffectRow,
    WorkflowHistoryRow,
    WorkflowInstance,
    WorkflowSignalRow,
)
from .._rows import row_as, rows_as
from ..ports import (
    EFFECT_JSON,
    ENDED_STATUSES,
    OutgoingEvent,
    SignalResult,
    StateTransaction,
    WorkflowFacts,
    WorkflowStart,
    WorkflowTransition,
    signal_target,
    workflow_step,
)
from ._db import PgDb
from ._transaction import PgTransaction, open_transaction

__all__ = ["PgWorkflows", "publish_steps", "start_on"]

T = TypeVar("T")


def instance_of(row: asyncpg.Record) -> WorkflowInstance:
    """A pointer row (with ``now`` and ``has_signals``) as the instance."""
    return row_as(WorkflowInstance, row, json=("visits",))


def _move_args(t: WorkflowTransition) -> list[Any]:
    h = t.history
    assert h is not None, "every transition writes its history row"
    lease_id, token = t.lease if t.lease is not None else (None, None)
    return [
        t.machine, t.key, t.state, t.status, orjson.dumps(t.visits).decode(), t.attempts,
        t.checkpoint, t.error_code, t.error, t.held_state, t.compensate_to, t.next_run_in,
        t.entered, t.new_run, t.expected_version, lease_id, token,
        h.state, h.visit, h.outcome, h.yielded, h.error_code, h.error, h.actor, h.reason,
        h.delivery_id, h.started_at, h.woken_by,
    ]  # fmt: skip


def _plain(t: WorkflowTransition) -> bool:
    """Writes only the pointer, its history and its step (and waits on no signal)."""
    return not (
        t.wake_on
        or t.consume_signals
        or t.effects
        or t.effect_status
        or t.approval_updates
        or t.approval_request
        or t.starts
        or t.children_wait is not None
        or t.status == "cancelled"
    )


def _moved_ends(
    ts: Sequence[WorkflowTransition], indexes: Sequence[int], out: Sequence[int | None]
) -> list[tuple[str, str]]:
    """The instances of a batch that moved into an ended status: child runs whose parents count them."""
    return [
        (ts[i].machine, ts[i].key) for i in indexes if out[i] is not None and ts[i].status in ENDED_STATUSES
    ]


def _batch_row(t: WorkflowTransition) -> list[Any]:
    return [*_move_args(t), t.step, t.step_delay]


async def _parts(
    conn: Any, sql: str, machine: str, rows: list[Any], flag: str, cls: type[T], json: tuple[str, ...] = ()
) -> dict[str, tuple[T, ...]]:
    """The rows of ``sql`` for the instances whose ``flag`` is set, grouped by key in order."""
    wanted = [r for r in rows if r[flag]]
    if not wanted:
        return {}
    found: dict[str, list[T]] = {}
    for row in await conn.fetch(sql, machine, [r["key"] for r in wanted], [r["run_id"] for r in wanted]):
        found.setdefault(row["key"], []).append(row_as(cls, row, json=json))
    return {key: tuple(parts) for key, parts in found.items()}


async def _children(
    conn: Any, sql: str, machine: str, rows: list[Any]
) -> dict[str, tuple[WorkflowChildRow, ...]]:
    """The child runs of the runs in ``rows`` that have some, by parent key in start order."""
    wanted = [r for r in rows if r["has_children"]]
    if not wanted:
        return {}
    found: dict[str, list[WorkflowChildRow]] = {}
    for row in await conn.fetch(sql, machine, [r["key"] for r in wanted], [r["run_id"] for r in wanted]):
        found.setdefault(row["parent"], []).append(row_as(WorkflowChildRow, row))
    return {key: tuple(parts) for key, parts in found.items()}


async def end_children(db: PgDb, conn: Any, ended: Sequence[tuple[str, str]]) -> None:
    """Record the ends of the child runs among ``ended`` (machine, key) and wake the parents they complete."""
    if not ended:
        return
    rows = await conn.fetch(db.q["wf_children_end"], [m for m, _ in ended], [k for _, k in ended])
    steps = [
        workflow_step(r["machine"], r["key"], r["version"], "children", priority=r["priority"]) for r in rows
    ]
    if steps:
        await publish_steps(db, conn, steps)


async def publish_steps(db: PgDb, conn: Any, steps: list[OutgoingEvent]) -> None:
    """Publish step events; a step due now first pulls its instance's delayed steps forward.

    The step subscription keeps per-key FIFO order, so a tick still waiting
    for its poll would otherwise hold back the step that wakes the instance.
    The tick that comes first then runs (or, stale, does nothing) at once.
    """
    now = [s for s in steps if s.delay_seconds == 0]
    if now:
        await conn.execute(db.q["wf_hasten"], [s.event_type for s in now], [s.ordering_key for s in now])
    await db.publish_on(conn, steps)


async def start_on(db: PgDb, conn: Any, s: WorkflowStart) -> WorkflowInstance | None:
    """Start the run ``s`` in the open transaction on ``conn``; None when it was refused.

    Used by :meth:`PgWorkflows.start` and by a completion that starts runs.
    """
    row = await conn.fetchrow(db.q["wf_start"], s.machine, s.key, s.state, s.checkpoint, s.once, s.priority)
    if row is None:
        if s.once:
            await conn.execute(db.q["wf_keep"], s.machine, s.key)
        return None
    inst = instance_of(row)
    step = workflow_step(s.machine, s.key, inst.version, "start", priority=s.priority)
    await publish_steps(db, conn, [step])
    return inst


class PgWorkflows:
    """:class:`~eventbus.backends.ports.WorkflowStore` on PostgreSQL (the guarantees are there)."""

    def __init__(self, db: PgDb) -> None:
        self.db = db
        self.q = db.q

    async def start(
        self, machine: str, key: str, state: str, checkpoint: bytes, once: bool = False, priority: int = 0
    ) -> tuple[WorkflowInstance, bool]:
        """Create the instance (or a new run of a finished one) and publish its first step."""
        start = WorkflowStart(machine, key, state, checkpoint, once, priority)
        async with self.db.tx() as conn:
            inst = await start_on(self.db, conn, start)
            if inst is None:
                found = await conn.fetchrow(self.q["wf_load"], machine, key)
                return instance_of(found), False
        return inst, True

    async def load(self, machine: str, key: str) -> WorkflowInstance | None:
        """The pointer as committed, with whether its run has open signals."""
        async with self.db.conn() as conn:
            row = await conn.fetchrow(self.q["wf_load"], machine, key)
        return None if row is None else instance_of(row)

    async def facts(self, machine: str, keys: Sequence[str]) -> dict[str, WorkflowFacts]:
        """The pointers of ``keys`` with what is open for their runs (see ``WorkflowStore.facts``)."""
        q = self.q
        async with self.db.conn() as conn:
            rows = await conn.fetch(q["wf_facts"], machine, list(keys))
            signals = await _parts(
                conn, q["wf_facts_signals"], machine, rows, "has_signals", WorkflowSignalRow
            )
            approvals = await _parts(
                conn, q["wf_facts_approvals"], machine, rows, "has_approvals", WorkflowApprovalRow
            )
            effects = await _parts(
                conn, q["wf_facts_effects"], machine, rows, "has_effects", WorkflowEffectRow, EFFECT_JSON
            )
            children = await _children(conn, q["wf_facts_children"], machine, rows)
        return {
            r["key"]: WorkflowFacts(
                instance_of(r),
                signals.get(r["key"], ()),
                approvals.get(r["key"], ()),
                effects.get(r["key"], ()),
                children.get(r["key"], ()),
            )
            for r in rows
        }

    async def commit(self, t: WorkflowTransition) -> int | None:
        """Apply ``t`` atomically; the new version, or None when the guard refused it."""
        return (await self.commit_many([t]))[0]

    @contextlib.asynccontextmanager
    async def transaction(self, timeout_seconds: float) -> AsyncIterator[StateTransaction]:
        """A pooled connection in a transaction for one visit of a transactional state."""
        async with open_transaction(self.db, timeout_seconds) as transaction:
            yield _StateTransaction(self, transaction)

    async def commit_many(self, ts: Sequence[WorkflowTransition]) -> list[int | None]:
        """As :meth:`commit` for each, in one transaction (see ``WorkflowStore.commit_many``).

        Plain transitions go in one statement, the others one by one.
        """
        out: list[int | None] = [None] * len(ts)
        plain = [i for i, t in enumerate(ts) if _plain(t)]
        async with self.db.tx() as conn:
            if plain:
                columns = [list(c) for c in zip(*(_batch_row(ts[i]) for i in plain), strict=True)]
                found = await conn.fetch(
                    self.q["wf_move_batch"], *columns, self.db.channel, self.db.priority_step
                )
                for row in found:
                    out[plain[row["ord"] - 1]] = int(row["version"])
                await self._hasten_moves([ts[i] for i in plain if out[i] is not None], conn)
                await end_children(self.db, conn, _moved_ends(ts, plain, out))
            for i, t in enumerate(ts):
                if not _plain(t):
                    out[i] = await self.commit_on(conn, t)
        return out

    async def _hasten_moves(self, moved: Sequence[WorkflowTransition], conn: Any) -> None:
        """An operator's move (no lease) whose step is due now pulls the instance's delayed tick forward.

        As :func:`publish_steps` does for every other step: the batch statement
        publishes its steps itself, and a repointed or resumed instance's step
        would otherwise wait behind a tick due much later. A visit's own step
        needs none: its instance's head step is the one that ran.
        """
        due = [t for t in moved if t.lease is None and t.step is not None and t.step_delay == 0]
        if due:
            await conn.execute(
                self.q["wf_hasten"],
                [f"wf.step.{t.machine}" for t in due],
                [f"{t.machine}/{t.key}" for t in due],
            )

    async def commit_on(self, conn: Any, t: WorkflowTransition) -> int | None:
        moved = await conn.fetchrow(self.q["wf_move"], *_move_args(t))
        if moved is None:
            return None
        version, priority = moved["version"], moved["priority"]
        await self._ledger(conn, t, version)
        woken = await self._family(conn, t)
        step, delay = t.step, t.step_delay
        if t.wake_on and (step is None or delay > 0):
            waiting = self.q["wf_signal_waiting"]
            if await conn.fetchval(waiting, t.machine, t.key, list(t.wake_on), t.run_id):
                step, delay = step or "wake", 0.0
        if woken and (step is None or delay > 0):
            step, delay = step or "children", 0.0
        if step is not None:
            await self._publish_steps(conn, [workflow_step(t.machine, t.key, version, step, delay, priority)])
        return int(version)

    async def _family(self, conn: Any, t: WorkflowTransition) -> bool:
        """Child runs a transition starts, cancels or ends; whether its own wait on children is due now."""
        if t.starts:
            started = await self._start_children(conn, t.starts)
            keys = [(s.machine, s.key) for s in t.starts]
            await conn.execute(self.q["wf_child_link"], t.machine, t.key, t.run_id, [m for m, _ in keys],
                               [k for _, k in keys], [k in started for k in keys])  # fmt: skip
        ended = [(t.machine, t.key)] if t.status in ENDED_STATUSES else []
        if t.status == "cancelled":
            reason = f"{t.machine}/{t.key} was cancelled"
            rows = await conn.fetch(self.q["wf_cancel_children"], t.machine, t.key, t.run_id,
                                    f"parent:{t.machine}/{t.key}", reason)  # fmt: skip
            ended += [(r["machine"], r["key"]) for r in rows]
        await end_children(self.db, conn, ended)
        if t.children_wait is None:
            return False
        return bool(await conn.fetchval(self.q["wf_children_wait"], t.machine, t.key, t.children_wait))

    async def _start_children(self, conn: Any, starts: Sequence[WorkflowStart]) -> set[tuple[str, str]]:
        """Start child runs in one statement (each key once, sorted); the (machine, key) of those started."""
        unique = sorted({(s.machine, s.key): s for s in reversed(starts)}.items())
        columns = [[s.machine for _, s in unique], [s.key for _, s in unique], [s.state for _, s in unique],
                   [s.checkpoint for _, s in unique], [s.once for _, s in unique],
                   [s.priority for _, s in unique]]  # fmt: skip
        rows = await conn.fetch(self.q["wf_start_many"], *columns)
        started = {(r["machine"], r["key"]) for r in rows}
        for key, s in unique:
            if s.once and key not in started:
                await conn.execute(self.q["wf_keep"], s.machine, s.key)
        steps = [
            workflow_step(r["machine"], r["key"], r["version"], "start", priority=r["priority"]) for r in rows
        ]
        if steps:
            await self._publish_steps(conn, steps)
        return started

    async def _ledger(self, conn: Any, t: WorkflowTransition, version: int) -> None:
        """The rows a transition writes beside the pointer: signals, effects, approvals."""
        if t.consume_signals:
            await conn.execute(
                self.q["wf_consume_signals"], t.machine, t.key, version, list(t.consume_signals)
            )
        if t.effects:
            await conn.executemany(
                self.q["wf_effect_insert"],
                [
                    (t.machine, t.key, t.run_id, e.state, e.op_key, e.kind, e.ref, e.compensation)
                    for e in t.effects
                ],
            )
        for effect_id, status in t.effect_status:
            await conn.execute(self.q["wf_effect_status"], effect_id, status)
        for approval_id, expected, status in t.approval_updates:
            await conn.execute(self.q["wf_approval_update"], approval_id, expected, status, version)
        if (a := t.approval_request) is not None:
            await conn.execute(
                self.q["wf_approval_request"],
                t.machine, t.key, t.run_id, a.state, a.input, a.input_hash, a.timeout_seconds,
            )  # fmt: skip

    async def find(
        self, machine: str, status: str | None, state: str | None, limit: int
    ) -> builtins.list[WorkflowInstance]:
        """Instances of a machine by key, optionally filtered by status and state."""
        async with self.db.conn() as conn:
            rows = await conn.fetch(self.q["wf_list"], machine, status, state, limit)
        return [instance_of(r) for r in rows]

    async def counts(self, machine: str, cap: int | None = None) -> dict[tuple[str, str], int]:
        """Instances per (state, status); with ``cap``, each count stops at ``cap + 1``."""
        async with self.db.conn() as conn:
            if cap is None:
                rows = await conn.fetch(self.q["wf_counts"], machine)
            else:
                rows = await conn.fetch(self.q["wf_counts_capped"], machine, cap + 1)
        return {(r["state"], r["status"]): int(r["n"]) for r in rows}

    async def history(self, machine: str, key: str) -> builtins.list[WorkflowHistoryRow]:
        """Every history row of an instance, in version order."""
        async with self.db.conn() as conn:
            rows = await conn.fetch(self.q["wf_history"], machine, key)
        return rows_as(WorkflowHistoryRow, rows)

    async def _publish_steps(self, conn: Any, steps: builtins.list[OutgoingEvent]) -> None:
        await publish_steps(self.db, conn, steps)

    async def signals(self, machine: str, key: str, open_only: bool) -> builtins.list[WorkflowSignalRow]:
        """Signals of an instance in arrival order (only unconsumed ones with ``open_only``)."""
        async with self.db.conn() as conn:
            rows = await conn.fetch(self.q["wf_signals"], machine, key, open_only)
        return rows_as(WorkflowSignalRow, rows)

    async def signal(
        self,
        machine: str,
        key: str,
        name: str,
        payload: bytes,
        dedupe: str | None,
        wake_states: Sequence[str],
        run_id: int | None = None,
    ) -> SignalResult:
        """Store a signal for the live run and wake it if it waits (see ``WorkflowStore.signal``)."""
        async with self.db.tx() as conn:
            pointer = await conn.fetchrow(self.q["wf_lock"], machine, key)
            refused = signal_target(pointer, run_id)
            if refused is not None:
                return refused
            new_id = await conn.fetchval(
                self.q["wf_signal_insert"], machine, key, name, dedupe, payload, pointer["run_id"]
            )
            if new_id is None:
                return "duplicate"
            if pointer["status"] == "waiting" and pointer["state"] in wake_states:
                step = workflow_step(
                    machine, key, pointer["version"], f"signal-{new_id}", priority=pointer["priority"]
                )
                await self._publish_steps(conn, [step])
        return "sent"

    async def approvals(self, machine: str, key: str) -> builtins.list[WorkflowApprovalRow]:
        """Every approval of an instance, oldest first."""
        async with self.db.conn() as conn:
            rows = await conn.fetch(self.q["wf_approvals"], machine, key)
        return rows_as(WorkflowApprovalRow, rows)

    async def approval(self, approval_id: int) -> WorkflowApprovalRow | None:
        """One approval by id."""
        async with self.db.conn() as conn:
            row = await conn.fetchrow(self.q["wf_approval"], approval_id)
        return None if row is None else row_as(WorkflowApprovalRow, row)

    async def decide(
        self, approval_id: int, status: str, by: str, reason: str | None
    ) -> WorkflowApprovalRow | None:
        """Decide a pending approval and wake its instance (see ``WorkflowStore.decide``)."""
        async with self.db.tx() as conn:
            row = await conn.fetchrow(self.q["wf_approval"], approval_id)
            if row is None:
                return None
            pointer = await conn.fetchrow(self.q["wf_lock"], row["machine"], row["key"])
            decided = await conn.fetchrow(self.q["wf_decide"], approval_id, status, by, reason)
            if decided is None:
                return None
            if pointer is not None and pointer["status"] == "waiting_approval":
                step = workflow_step(
                    row["machine"],
                    row["key"],
                    pointer["version"],
                    f"approval-{approval_id}",
                    priority=pointer["priority"],
                )
                await self._publish_steps(conn, [step])
        return row_as(WorkflowApprovalRow, decided)

    async def effects(self, machine: str, key: str, run_id: int) -> builtins.list[WorkflowEffectRow]:
        """The effects recorded in one run, in the order they were recorded."""
        async with self.db.conn() as conn:
            rows = await conn.fetch(self.q["wf_effects"], machine, key, run_id)
        return rows_as(WorkflowEffectRow, rows, json=EFFECT_JSON)

    async def sweep(self, machine: str, grace_seconds: float, limit: int = 500) -> int:
        """Publish a step for overdue live instances whose tick was lost; return how many."""
        reason = f"sweep-{int(time.time())}"
        async with self.db.tx() as conn:
            rows = await conn.fetch(self.q["wf_sweep"], machine, grace_seconds, limit)
            steps = [
                workflow_step(machine, r["key"], r["version"], reason, priority=r["priority"]) for r in rows
            ]
            if steps:
                await self._publish_steps(conn, steps)
        return len(steps)

    async def record_definition(self, machine: str, def_hash: str, definition: bytes) -> None:
        """Record the table ``def_hash`` as the one in force (see ``WorkflowStore.record_definition``)."""
        async with self.db.conn() as conn:
            await conn.execute(self.q["wf_definition_record"], machine, def_hash, definition.decode())

    async def definition(self, machine: str) -> WorkflowDefinitionRow | None:
        """The table in force, or None when none was recorded."""
        async with self.db.conn() as conn:
            row = await conn.fetchrow(self.q["wf_definition"], machine)
        return None if row is None else row_as(WorkflowDefinitionRow, row, json=("definition",))


class _StateTransaction:
    """A transactional state's transaction (see ``StateTransaction``)."""

    def __init__(self, store: PgWorkflows, transaction: PgTransaction) -> None:
        self._store = store
        self._transaction = transaction

    @property
    def connection(self) -> Any:
        return self._transaction.connection

    async def commit(self, t: WorkflowTransition) -> int | None:
        """Write the transition on this connection and commit; roll back when it is refused."""

        async def move(conn: Any) -> int | None:
            return await self._store.commit_on(conn, t)

        return await self._transaction.finish(move, "a transactional transition")
