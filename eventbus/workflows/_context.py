"""What a state function gets beside its checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import orjson

from ..backends.base import WorkflowEffect
from ..errors import ConfigurationError
from ..types import WorkflowApprovalRow, WorkflowInstance, WorkflowSignalRow

__all__ = ["StepContext"]


class StepContext:
    """One visit of one state: its identity, the signals it may read, the effects it records.

    ``op_key`` is ``machine/key/run/state/visit``: the same for every delivery
    of this visit (a re-run after a crash or a lost lease), different for the
    next visit. Hand it to external providers as the idempotency key.
    """

    __slots__ = (
        "_compensations", "_connection", "_signals", "approval", "attempt", "consumed", "effects", "key",
        "machine", "op_key", "run_id", "state", "version", "visit",
    )  # fmt: skip

    machine: str
    """The machine's name."""
    key: str
    """The instance's key."""
    run_id: int
    """The run of the instance this visit belongs to (1, then 2 for the next run of the key, …);
    signals are kept per run: pass it back as ``signal(run_id=…)``."""
    version: int
    """The instance's version this visit read: its commit is guarded by it."""
    state: str
    """The state being visited (``COMPENSATING`` for a compensation)."""
    visit: int
    """Which visit of this state in this run it is, from 1 (what ``max_visits`` caps)."""
    attempt: int
    """Which delivery of this visit it is, from 1: above 1 after a crash or a lost lease."""
    approval: WorkflowApprovalRow | None
    """The approval this visit runs under (who decided and why), if the state needs one."""
    op_key: str
    """``machine/key/run/state/visit``: the idempotency key for providers, the same on every re-run."""
    consumed: list[int]
    """Ids of the signals read by this visit, consumed with its transition."""
    effects: list[WorkflowEffect]
    """The effects recorded by this visit, committed with its transition."""

    def __init__(
        self,
        instance: WorkflowInstance,
        state: str,
        visit: int,
        signals: list[WorkflowSignalRow],
        compensations: dict[str, Callable[..., Any]],
        attempt: int = 1,
        approval: WorkflowApprovalRow | None = None,
        connection: Any = None,
    ) -> None:
        self._connection = connection
        self.machine = instance.machine
        self.key = instance.key
        self.run_id = instance.run_id
        self.version = instance.version
        self.state = state
        self.visit = visit
        self.attempt = attempt
        self.approval = approval
        self.op_key = f"{instance.machine}/{instance.key}/{instance.run_id}/{state}/{visit}"
        self._signals = signals
        self._compensations = compensations
        self.consumed: list[int] = []
        self.effects: list[WorkflowEffect] = []

    @property
    def connection(self) -> Any:
        """The database connection of a transactional state (``@machine.state(..., transactional=True)``).

        On PostgreSQL an asyncpg connection, on SQLite an aiosqlite connection,
        inside the transaction this visit's transition commits in. Do not
        commit, roll back or close it. :class:`ConfigurationError` for a state
        that is not transactional.
        """
        if self._connection is None:
            raise ConfigurationError(
                f"state {self.state!r} of {self.machine!r} is not transactional: ctx.connection is given "
                "only to states declared with transactional=True"
            )
        return self._connection

    def signal(self, name: str) -> Any:
        """The payload of the oldest unconsumed signal ``name`` (consumed with this transition), or None."""
        for row in self._signals:
            if row.name == name and row.id not in self.consumed:
                self.consumed.append(row.id)
                return orjson.loads(row.payload)
        return None

    def record_effect(
        self, kind: str, *, ref: Any = None, compensate: Callable[..., Any] | str | None = None
    ) -> None:
        """Record an irreversible effect, committed with this transition.

        When the run ends on a failure terminal, the compensations of recorded
        effects run in reverse order. ``compensate`` must be registered with
        ``@machine.compensation``.
        """
        if not isinstance(kind, str) or not kind or "\x00" in kind:
            raise ConfigurationError(f"an effect's kind is a non-empty str without NUL, not {kind!r}")
        name = compensate if isinstance(compensate, str) or compensate is None else compensate.__name__
        if name is not None and name not in self._compensations:
            raise ConfigurationError(f"compensation {name!r} is not registered with @machine.compensation")
        seq = len(self.effects)
        self.effects.append(
            WorkflowEffect(
                state=self.state,
                op_key=f"{self.op_key}/{seq}",
                kind=kind,
                ref=msgspec.json.encode(ref if ref is not None else {}).decode(),
                compensation=name,
            )
        )
