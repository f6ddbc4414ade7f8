"""The :class:`~eventbus.backends.base.WorkflowStore` port on SQLite.

The write functions are transaction bodies (``conn, q, now, ...``) run under
``BEGIN IMMEDIATE`` on the writer's thread, like those of :mod:`.delivery`;
the write lock serialises them with every claim and completion of the file.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

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
from ._db import SQLiteDb
from ._link import Queries
from ._transaction import SQLiteTransaction, open_transaction
from ._units import publish

__all__ = ["SQLiteWorkflows"]

Row = sqlite3.Row
T = TypeVar("T")


class SQLiteWorkflows:
    """State-machine pointers, history, signals, approvals and effects in one SQLite file."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def start(
        self, machine: str, key: str, state: str, checkpoint: bytes, once: bool = False, priority: int = 0
    ) -> tuple[WorkflowInstance, bool]:
        inst, started, types = await self._db.write(
            start, WorkflowStart(machine, key, state, checkpoint, once, priority)
        )
        self._db.wake(types)
        return inst, started

    async def load(self, machine: str, key: str) -> WorkflowInstance | None:
        found = await self._db.fetch("wf_load", {"machine": machine, "key": key})
        return instance_of(found[0]) if found else None

    async def facts(self, machine: str, keys: Sequence[str]) -> dict[str, WorkflowFacts]:
        params = {"machine": machine, "keys": orjson.dumps(list(keys)).decode()}
        q = self._db.q
        return await self._db.read(lambda conn: read_facts(conn, q, params))

    async def commit(self, t: WorkflowTransition) -> int | None:
        return (await self.commit_many([t]))[0]

    @contextlib.asynccontextmanager
    async def transaction(self, timeout_seconds: float) -> AsyncIterator[StateTransaction]:
        """The writer's connection in BEGIN IMMEDIATE for one visit of a transactional state."""
        async with open_transaction(self._db, timeout_seconds) as transaction:
            yield _StateTransaction(transaction)

    async def commit_many(self, ts: Sequence[WorkflowTransition]) -> list[int | None]:
        versions, types = await self._db.write(commit_many, ts)
        self._db.wake(types)
        return versions

    async def find(
        self, machine: str, status: str | None, state: str | None, limit: int
    ) -> list[WorkflowInstance]:
        params = {"machine": machine, "status": status, "state": state, "limit": limit}
        return [instance_of(r) for r in await self._db.fetch("wf_list", params)]

    async def counts(self, machine: str, cap: int | None = None) -> dict[tuple[str, str], int]:
        if cap is None:
            found = await self._db.fetch("wf_counts", {"machine": machine})
        else:
            found = await self._db.fetch("wf_counts_capped", {"machine": machine, "limit": cap + 1})
        return {(r["state"], r["status"]): int(r["n"]) for r in found}

    async def history(self, machine: str, key: str) -> list[WorkflowHistoryRow]:
        found = await self._db.fetch("wf_history", {"machine": machine, "key": key})
        return rows_as(WorkflowHistoryRow, found)

    async def signals(self, machine: str, key: str, open_only: bool) -> list[WorkflowSignalRow]:
        params = {"machine": machine, "key": key, "open_only": int(open_only)}
        return rows_as(WorkflowSignalRow, await self._db.fetch("wf_signals", params))

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
        params = {"machine": machine, "key": key, "name": name, "dedupe": dedupe, "payload": payload}
        result, types = await self._db.write(signal, params, list(wake_states), run_id)
        self._db.wake(types)
        return result

    async def approvals(self, machine: str, key: str) -> list[WorkflowApprovalRow]:
        found = await self._db.fetch("wf_approvals", {"machine": machine, "key": key})
        return rows_as(WorkflowApprovalRow, found)

    async def approval(self, approval_id: int) -> WorkflowApprovalRow | None:
        found = await self._db.fetch("wf_approval", {"id": approval_id})
        return row_as(WorkflowApprovalRow, found[0]) if found else None

    async def decide(
        self, approval_id: int, status: str, by: str, reason: str | None
    ) -> WorkflowApprovalRow | None:
        params = {"id": approval_id, "status": status, "by": by, "reason": reason}
        decided, types = await self._db.write(decide, params)
        self._db.wake(types)
        return decided

    async def effects(self, machine: str, key: str, run_id: int) -> list[WorkflowEffectRow]:
        params = {"machine": machine, "key": key, "run_id": run_id}
        return rows_as(WorkflowEffectRow, await self._db.fetch("wf_effects", params), json=EFFECT_JSON)

    async def sweep(self, machine: str, grace_seconds: float, limit: int = 500) -> int:
        count, types = await self._db.write(sweep, machine, grace_seconds, limit)
        self._db.wake(types)
        return count

    async def record_definition(self, machine: str, def_hash: str, definition: bytes) -> None:
        params = {"machine": machine, "def_hash": def_hash, "definition": definition.decode()}
        await self._db.write(
            lambda conn, q, now: conn.execute(q["wf_definition_record"], {**params, "now": now})
        )

    async def definition(self, machine: str) -> WorkflowDefinitionRow | None:
        found = await self._db.fetch("wf_definition", {"machine": machine})
        return row_as(WorkflowDefinitionRow, found[0], json=("definition",)) if found else None


def instance_of(row: Row) -> WorkflowInstance:
    return row_as(WorkflowInstance, row, json=("visits",))


def read_facts(conn: sqlite3.Connection, q: Queries, params: dict[str, Any]) -> dict[str, WorkflowFacts]:
    """The pointers with what is open for their runs; each part read only for the instances that have some."""
    rows = conn.execute(q["wf_facts"], params).fetchall()
    machine = params["machine"]
    signals = _parts(conn, q["wf_facts_signals"], machine, rows, "has_signals", WorkflowSignalRow)
    approvals = _parts(conn, q["wf_facts_approvals"], machine, rows, "has_approvals", WorkflowApprovalRow)
    effects = _parts(
        conn, q["wf_facts_effects"], machine, rows, "has_effects", WorkflowEffectRow, EFFECT_JSON
    )
    children = _children(conn, q["wf_facts_children"], machine, rows)
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


def _children(
    conn: sqlite3.Connection, sql: str, machine: str, rows: list[Row]
) -> dict[str, tuple[WorkflowChildRow, ...]]:
    """The child runs of the runs in ``rows`` that have some, by parent key in start order."""
    wanted = [[r["key"], r["run_id"]] for r in rows if r["has_children"]]
    if not wanted:
        return {}
    found: dict[str, list[WorkflowChildRow]] = {}
    for row in conn.execute(sql, {"machine": machine, "runs": orjson.dumps(wanted).decode()}).fetchall():
        found.setdefault(row["parent"], []).append(row_as(WorkflowChildRow, row))
    return {key: tuple(parts) for key, parts in found.items()}


def _parts(
    conn: sqlite3.Connection,
    sql: str,
    machine: str,
    rows: list[Row],
    flag: str,
    cls: type[T],
    json: tuple[str, ...] = (),
) -> dict[str, tuple[T, ...]]:
    """The rows of ``sql`` for the instances whose ``flag`` is set, grouped by key in order."""
    wanted = [[r["key"], r["run_id"]] for r in rows if r[flag]]
    if not wanted:
        return {}
    found: dict[str, list[T]] = {}
    for row in conn.execute(sql, {"machine": machine, "runs": orjson.dumps(wanted).decode()}).fetchall():
        found.setdefault(row["key"], []).append(row_as(cls, row, json=json))
    return {key: tuple(parts) for key, parts in found.items()}


# -- units of work (on the writer's thread, under the write lock) ---------------------


def _params(t: WorkflowTransition, now: float) -> dict[str, Any]:
    h = t.history
    assert h is not None, "every transition writes its history row"
    lease_id, token = t.lease if t.lease is not None else (None, None)
    return {
        "machine": t.machine, "key": t.key, "state": t.state, "status": t.status,
        "visits": orjson.dumps(t.visits).decode(), "attempts": t.attempts,
        "checkpoint": t.checkpoint, "error_code": t.error_code, "error": t.error,
        "held_state": t.held_state, "compensate_to": t.compensate_to, "next_run_in": t.next_run_in,
        "entered": int(t.entered), "new_run": int(t.new_run), "expected_version": t.expected_version,
        "lease_id": lease_id, "lease_token": token, "now": now,
        "h_state": h.state, "visit": h.visit, "outcome": h.outcome, "yielded": int(h.yielded),
        "h_error_code": h.error_code, "h_error": h.error, "actor": h.actor, "reason": h.reason,
        "delivery_id": h.delivery_id, "started_at": h.started_at, "woken_by": h.woken_by,
    }  # fmt: skip


def start(
    conn: sqlite3.Connection, q: Queries, now: float, s: WorkflowStart
) -> tuple[WorkflowInstance, bool, set[str]]:
    """Start the run ``s``; the instance as it is, whether it started, and the types woken."""
    inst, types = start_on(conn, q, now, s)
    if inst is None:
        found = conn.execute(q["wf_load"], {"machine": s.machine, "key": s.key, "now": now}).fetchone()
        return instance_of(found), False, set()
    return inst, True, types


def start_on(
    conn: sqlite3.Connection, q: Queries, now: float, s: WorkflowStart
) -> tuple[WorkflowInstance | None, set[str]]:
    """Start the run ``s`` in the open write transaction (None when refused) and publish its step.

    Used by :meth:`SQLiteWorkflows.start` and by a completion that starts runs.
    """
    params = {
        "machine": s.machine, "key": s.key, "state": s.state, "checkpoint": s.checkpoint,
        "once": int(s.once), "priority": s.priority, "now": now,
    }  # fmt: skip
    rows = conn.execute(q["wf_start"], params).fetchall()
    if not rows:
        if s.once:
            conn.execute(q["wf_keep"], params)
        return None, set()
    inst = instance_of(rows[0])
    step = workflow_step(s.machine, s.key, inst.version, "start", priority=s.priority)
    _, types = publish_steps(conn, q, now, [step])
    return inst, types


def commit_many(
    conn: sqlite3.Connection, q: Queries, now: float, ts: Sequence[WorkflowTransition]
) -> tuple[list[int | None], set[str]]:
    """Every transition of a batch under one write lock and one commit."""
    versions: list[int | None] = []
    woken: set[str] = set()
    for t in ts:
        version, types = commit(conn, q, now, t)
        versions.append(version)
        woken |= types
    return versions, woken


def commit(
    conn: sqlite3.Connection, q: Queries, now: float, t: WorkflowTransition
) -> tuple[int | None, set[str]]:
    params = _params(t, now)
    moved = conn.execute(q["wf_move"], params).fetchall()
    if not moved:
        return None, set()
    version, run_id, priority = int(moved[0][0]), int(moved[0][1]), int(moved[0][2])
    conn.execute(q["wf_history_insert"], {**params, "version": version, "run_id": run_id})
    _ledger(conn, q, now, t, version)
    woken, types = _family(conn, q, now, t)
    step, delay = t.step, t.step_delay
    if t.wake_on and (step is None or delay > 0):
        found = {**params, "names": orjson.dumps(list(t.wake_on)).decode(), "run_id": t.run_id}
        if conn.execute(q["wf_signal_waiting"], found).fetchone()[0]:
            step, delay = step or "wake", 0.0
    if woken and (step is None or delay > 0):
        step, delay = step or "children", 0.0
    if step is None:
        return version, types
    _, more = publish_steps(conn, q, now, [workflow_step(t.machine, t.key, version, step, delay, priority)])
    return version, types | more


def _family(conn: sqlite3.Connection, q: Queries, now: float, t: WorkflowTransition) -> tuple[bool, set[str]]:
    """Child runs a transition starts, cancels or ends; whether its own wait on children is due now."""
    base = {"machine": t.machine, "key": t.key, "run_id": t.run_id, "now": now}
    types: set[str] = set()
    for s in t.starts:
        inst, started = start_on(conn, q, now, s)
        types |= started
        link = {**base, "child_machine": s.machine, "child_key": s.key, "started": int(inst is not None)}
        linked = conn.execute(q["wf_child_link"], link).fetchall()
        if linked and linked[0][0] is not None:  # linked to a run that had already ended: it counts
            conn.execute(q["wf_children_count"], {**base, "n": 1}).fetchall()
    ended = [(t.machine, t.key)] if t.status in ENDED_STATUSES else []
    if t.status == "cancelled":
        ended += _cancel_children(conn, q, now, t)
    types |= end_children(conn, q, now, ended)
    if t.children_wait is None:
        return False, types
    due = conn.execute(q["wf_children_wait"], {**base, "wait": t.children_wait}).fetchone()
    return bool(due[0]), types


def _cancel_children(
    conn: sqlite3.Connection, q: Queries, now: float, t: WorkflowTransition
) -> list[tuple[str, str]]:
    """Cancel the live runs ``t``'s run started, and theirs, each with its history row."""
    base = {"machine": t.machine, "key": t.key, "run_id": t.run_id, "now": now}
    cancelled = []
    for row in conn.execute(q["wf_cancel_tree"], base).fetchall():
        child = {"machine": row["machine"], "key": row["key"], "run_id": row["run_id"], "now": now}
        version = conn.execute(q["wf_cancel_child"], child).fetchone()[0]
        visits = orjson.loads(row["visits"]).get(row["state"], 0)
        conn.execute(q["wf_history_insert"], {
            **child, "version": version, "h_state": row["state"], "visit": visits, "outcome": "cancel",
            "state": "CANCELLED", "yielded": 0, "h_error_code": None, "h_error": None,
            "actor": f"parent:{t.machine}/{t.key}", "reason": f"{t.machine}/{t.key} was cancelled",
            "delivery_id": None, "started_at": None, "woken_by": None,
        })  # fmt: skip
        cancelled.append((row["machine"], row["key"]))
    return cancelled


def end_children(
    conn: sqlite3.Connection, q: Queries, now: float, ended: Sequence[tuple[str, str]]
) -> set[str]:
    """Record the ends of the child runs among ``ended`` and wake the parents they complete."""
    steps = []
    for machine, key in ended:
        parents = conn.execute(q["wf_children_end"], {"machine": machine, "key": key, "now": now}).fetchall()
        for p in parents:
            parent = {"machine": p[0], "key": p[1], "run_id": p[2], "n": 1}
            row = conn.execute(q["wf_children_count"], parent).fetchone()
            if (
                row is not None
                and row["status"] == "waiting"
                and row["children_ended"] == row["children_wait"]
            ):
                steps.append(
                    workflow_step(
                        row["machine"], row["key"], row["version"], "children", priority=row["priority"]
                    )
                )
    if not steps:
        return set()
    _, types = publish_steps(conn, q, now, steps)
    return types


def _ledger(conn: sqlite3.Connection, q: Queries, now: float, t: WorkflowTransition, version: int) -> None:
    """The rows a transition writes beside the pointer: signals, effects, approvals."""
    base = {"machine": t.machine, "key": t.key, "run_id": t.run_id, "version": version, "now": now}
    if t.consume_signals:
        conn.execute(q["wf_consume_signals"], {**base, "ids": orjson.dumps(list(t.consume_signals)).decode()})
    for e in t.effects:
        conn.execute(
            q["wf_effect_insert"],
            {
                **base,
                "state": e.state,
                "op_key": e.op_key,
                "kind": e.kind,
                "ref": e.ref,
                "compensation": e.compensation,
            },
        )
    for effect_id, status in t.effect_status:
        conn.execute(q["wf_effect_status"], {"id": effect_id, "status": status})
    for approval_id, expected, status in t.approval_updates:
        conn.execute(
            q["wf_approval_update"], {**base, "id": approval_id, "expected": expected, "status": status}
        )
    if (a := t.approval_request) is not None:
        conn.execute(
            q["wf_approval_request"],
            {
                **base,
                "state": a.state,
                "input": a.input,
                "input_hash": a.input_hash,
                "timeout_seconds": a.timeout_seconds,
            },
        )


def signal(
    conn: sqlite3.Connection,
    q: Queries,
    now: float,
    params: dict[str, Any],
    wake_states: Sequence[str],
    run_id: int | None,
) -> tuple[SignalResult, set[str]]:
    pointer = conn.execute(q["wf_lock"], params).fetchone()
    refused = signal_target(pointer, run_id)
    if refused is not None:
        return refused, set()
    params = {**params, "now": now, "run_id": pointer["run_id"]}
    inserted = conn.execute(q["wf_signal_insert"], params).fetchall()
    if not inserted:
        return "duplicate", set()
    if pointer["status"] != "waiting" or pointer["state"] not in wake_states:
        return "sent", set()
    reason = f"signal-{inserted[0][0]}"
    step = workflow_step(
        params["machine"], params["key"], pointer["version"], reason, priority=pointer["priority"]
    )
    _, types = publish_steps(conn, q, now, [step])
    return "sent", types


def publish_steps(
    conn: sqlite3.Connection, q: Queries, now: float, steps: list[OutgoingEvent]
) -> tuple[Any, set[str]]:
    """Publish step events; a step due now first pulls its instance's delayed steps forward.

    The step subscription keeps per-key FIFO order, so a tick still waiting for
    its poll would otherwise hold back the step that wakes the instance.
    """
    for step in steps:
        if step.delay_seconds == 0:
            conn.execute(
                q["wf_hasten"], {"event_type": step.event_type, "ordering_key": step.ordering_key, "now": now}
            )
    return publish(conn, q, now, steps)


def decide(
    conn: sqlite3.Connection, q: Queries, now: float, params: dict[str, Any]
) -> tuple[WorkflowApprovalRow | None, set[str]]:
    params = {**params, "now": now}
    decided = conn.execute(q["wf_decide"], params).fetchall()
    if not decided:
        return None, set()
    row = decided[0]
    pointer = conn.execute(q["wf_lock"], {"machine": row["machine"], "key": row["key"]}).fetchone()
    if pointer is None or pointer["status"] != "waiting_approval":
        return row_as(WorkflowApprovalRow, row), set()
    reason = f"approval-{row['id']}"
    step = workflow_step(row["machine"], row["key"], pointer["version"], reason, priority=pointer["priority"])
    _, types = publish_steps(conn, q, now, [step])
    return row_as(WorkflowApprovalRow, row), types


def sweep(
    conn: sqlite3.Connection, q: Queries, now: float, machine: str, grace_seconds: float, limit: int
) -> tuple[int, set[str]]:
    params = {"machine": machine, "grace_seconds": grace_seconds, "limit": limit, "now": now}
    rows = conn.execute(q["wf_sweep"], params).fetchall()
    reason = f"sweep-{int(time.time())}"
    steps = [workflow_step(machine, r["key"], r["version"], reason, priority=r["priority"]) for r in rows]
    if not steps:
        return 0, set()
    _, types = publish_steps(conn, q, now, steps)
    return len(steps), types


class _StateTransaction:
    """A transactional state's transaction (see ``StateTransaction``)."""

    def __init__(self, transaction: SQLiteTransaction) -> None:
        self._transaction = transaction

    @property
    def connection(self) -> Any:
        return self._transaction.connection

    async def commit(self, t: WorkflowTransition) -> int | None:
        """Write the transition in the held transaction and commit; roll back when it is refused."""
        return await self._transaction.finish(lambda conn, q, now: commit(conn, q, now, t))
