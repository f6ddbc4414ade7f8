"""The :class:`~eventbus.backends.base.WorkflowStore` port on PostgreSQL."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson

from ...types import (
    PublishResult,
    WorkflowApprovalRow,
    WorkflowEffectRow,
    WorkflowHistoryRow,
    WorkflowInstance,
    WorkflowSignalRow,
)
from ..base import OutgoingEvent, WorkflowTransition, workflow_step

__all__ = ["PostgresWorkflows"]


def instance_of(row: asyncpg.Record) -> WorkflowInstance:
    return WorkflowInstance(
        machine=row["machine"],
        key=row["key"],
        run_id=row["run_id"],
        state=row["state"],
        status=row["status"],
        version=row["version"],
        visits=orjson.loads(row["visits"]),
        attempts=row["attempts"],
        checkpoint=bytes(row["checkpoint"]),
        last_error_code=row["last_error_code"],
        last_error=row["last_error"],
        held_state=row["held_state"],
        compensate_to=row["compensate_to"],
        next_run_at=row["next_run_at"],
        state_entered_at=row["state_entered_at"],
        run_started_at=row["run_started_at"],
        updated_at=row["updated_at"],
        now=row["now"],
        has_signals=row["has_signals"],
    )


def approval_of(row: asyncpg.Record) -> WorkflowApprovalRow:
    values: dict[str, Any] = {f: row[f] for f in WorkflowApprovalRow.__struct_fields__}
    values["input"] = bytes(values["input"])
    return WorkflowApprovalRow(**values)


def _move_args(t: WorkflowTransition) -> list[Any]:
    h = t.history
    assert h is not None, "every transition writes its history row"
    lease_id, token = t.lease if t.lease is not None else (None, None)
    return [
        t.machine, t.key, t.state, t.status, orjson.dumps(t.visits).decode(), t.attempts,
        t.checkpoint, t.error_code, t.error, t.held_state, t.compensate_to, t.next_run_in,
        t.entered, t.new_run, t.expected_version, lease_id, token,
        h.state, h.visit, h.outcome, h.yielded, h.error_code, h.error, h.actor, h.reason,
        h.delivery_id, h.started_at,
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
    )


def _batch_row(t: WorkflowTransition) -> list[Any]:
    return [*_move_args(t), t.step, t.step_delay]


class PostgresWorkflows:
    """Mixed into :class:`PostgresBackend`: every write is one transaction."""

    q: dict[str, str]
    notify_channel: str

    if TYPE_CHECKING:

        def _tx(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

        def _conn(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

        async def _publish_on(self, conn: Any, events: Sequence[OutgoingEvent]) -> list[PublishResult]: ...

    async def wf_start(
        self, machine: str, key: str, state: str, checkpoint: bytes
    ) -> tuple[WorkflowInstance, bool]:
        async with self._tx() as conn:
            row = await conn.fetchrow(self.q["wf_start"], machine, key, state, checkpoint)
            if row is None:
                found = await conn.fetchrow(self.q["wf_load"], machine, key)
                return instance_of(found), False
            inst = instance_of(row)
            await self._publish_steps(conn, [workflow_step(machine, key, inst.version, "start")])
        return inst, True

    async def wf_load(self, machine: str, key: str) -> WorkflowInstance | None:
        async with self._conn() as conn:
            row = await conn.fetchrow(self.q["wf_load"], machine, key)
        return None if row is None else instance_of(row)

    async def wf_load_many(self, machine: str, keys: Sequence[str]) -> dict[str, WorkflowInstance]:
        async with self._conn() as conn:
            rows = await conn.fetch(self.q["wf_load_many"], machine, list(keys))
        return {r["key"]: instance_of(r) for r in rows}

    async def wf_commit(self, t: WorkflowTransition) -> int | None:
        return (await self.wf_commit_many([t]))[0]

    async def wf_commit_many(self, ts: Sequence[WorkflowTransition]) -> list[int | None]:
        """Plain transitions in one statement, the others one by one, all in one transaction."""
        out: list[int | None] = [None] * len(ts)
        plain = [i for i, t in enumerate(ts) if _plain(t)]
        async with self._tx() as conn:
            if plain:
                columns = [list(c) for c in zip(*(_batch_row(ts[i]) for i in plain), strict=True)]
                for row in await conn.fetch(self.q["wf_move_batch"], *columns, self.notify_channel):
                    out[plain[row["ord"] - 1]] = int(row["version"])
            for i, t in enumerate(ts):
                if not _plain(t):
                    out[i] = await self._commit_on(conn, t)
        return out

    async def _commit_on(self, conn: Any, t: WorkflowTransition) -> int | None:
        version = await conn.fetchval(self.q["wf_move"], *_move_args(t))
        if version is None:
            return None
        await self._ledger(conn, t, version)
        if t.step is not None:
            delay = t.step_delay
            if delay > 0 and t.wake_on:
                found = await conn.fetchval(self.q["wf_signal_waiting"], t.machine, t.key, list(t.wake_on))
                delay = 0.0 if found else delay
            await self._publish_steps(conn, [workflow_step(t.machine, t.key, version, t.step, delay)])
        return int(version)

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

    async def wf_list(
        self, machine: str, status: str | None, state: str | None, limit: int
    ) -> list[WorkflowInstance]:
        async with self._conn() as conn:
            rows = await conn.fetch(self.q["wf_list"], machine, status, state, limit)
        return [instance_of(r) for r in rows]

    async def wf_counts(self, machine: str) -> dict[tuple[str, str], int]:
        async with self._conn() as conn:
            rows = await conn.fetch(self.q["wf_counts"], machine)
        return {(r["state"], r["status"]): int(r["n"]) for r in rows}

    async def wf_history(self, machine: str, key: str) -> list[WorkflowHistoryRow]:
        async with self._conn() as conn:
            rows = await conn.fetch(self.q["wf_history"], machine, key)
        return [WorkflowHistoryRow(**dict(r)) for r in rows]

    async def _publish_steps(self, conn: Any, steps: list[OutgoingEvent]) -> None:
        """Publish step events; a step due now first pulls its instance's delayed steps forward.

        The step subscription keeps per-key FIFO order, so a tick still waiting
        for its poll would otherwise hold back the step that wakes the instance.
        The tick that comes first then runs (or, stale, does nothing) at once.
        """
        now = [s for s in steps if s.delay_seconds == 0]
        if now:
            await conn.execute(
                self.q["wf_hasten"], [s.event_type for s in now], [s.ordering_key for s in now]
            )
        await self._publish_on(conn, steps)

    async def wf_signals(self, machine: str, key: str, open_only: bool) -> list[WorkflowSignalRow]:
        async with self._conn() as conn:
            rows = await conn.fetch(self.q["wf_signals"], machine, key, open_only)
        return [WorkflowSignalRow(**{**dict(r), "payload": bytes(r["payload"])}) for r in rows]

    async def wf_signal(
        self,
        machine: str,
        key: str,
        name: str,
        payload: bytes,
        dedupe: str | None,
        wake_states: Sequence[str],
    ) -> bool:
        async with self._tx() as conn:
            pointer = await conn.fetchrow(self.q["wf_lock"], machine, key)
            new_id = await conn.fetchval(self.q["wf_signal_insert"], machine, key, name, dedupe, payload)
            if new_id is None:
                return False
            if pointer is not None and pointer["status"] == "waiting" and pointer["state"] in wake_states:
                step = workflow_step(machine, key, pointer["version"], f"signal-{new_id}")
                await self._publish_steps(conn, [step])
        return True

    async def wf_approvals(self, machine: str, key: str) -> list[WorkflowApprovalRow]:
        async with self._conn() as conn:
            rows = await conn.fetch(self.q["wf_approvals"], machine, key)
        return [approval_of(r) for r in rows]

    async def wf_approval(self, approval_id: int) -> WorkflowApprovalRow | None:
        async with self._conn() as conn:
            row = await conn.fetchrow(self.q["wf_approval"], approval_id)
        return None if row is None else approval_of(row)

    async def wf_decide(
        self, approval_id: int, status: str, by: str, reason: str | None
    ) -> WorkflowApprovalRow | None:
        async with self._tx() as conn:
            row = await conn.fetchrow(self.q["wf_approval"], approval_id)
            if row is None:
                return None
            pointer = await conn.fetchrow(self.q["wf_lock"], row["machine"], row["key"])
            decided = await conn.fetchrow(self.q["wf_decide"], approval_id, status, by, reason)
            if decided is None:
                return None
            if pointer is not None and pointer["status"] == "waiting_approval":
                step = workflow_step(
                    row["machine"], row["key"], pointer["version"], f"approval-{approval_id}"
                )
                await self._publish_steps(conn, [step])
        return approval_of(decided)

    async def wf_effects(self, machine: str, key: str, run_id: int) -> list[WorkflowEffectRow]:
        async with self._conn() as conn:
            rows = await conn.fetch(self.q["wf_effects"], machine, key, run_id)
        return [WorkflowEffectRow(**dict(r)) for r in rows]

    async def wf_sweep(self, machine: str, grace_seconds: float, limit: int = 500) -> int:
        reason = f"sweep-{int(time.time())}"
        async with self._tx() as conn:
            rows = await conn.fetch(self.q["wf_sweep"], machine, grace_seconds, limit)
            steps = [workflow_step(machine, r["key"], r["version"], reason) for r in rows]
            if steps:
                await self._publish_steps(conn, steps)
        return len(steps)
