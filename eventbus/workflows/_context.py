"""What a state function gets beside its checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import msgspec
import orjson

from ..backends.base import WorkflowEffect, WorkflowStart
from ..errors import ConfigurationError, DecodeError
from ..types import WorkflowApprovalRow, WorkflowChildRow, WorkflowInstance, WorkflowSignalRow

__all__ = ["Child", "Family", "StepContext", "child_of"]


class Family(Protocol):
    """What a visit needs to start child runs and read them back (the bus's workflows)."""

    @property
    def machines(self) -> Mapping[str, Any]: ...

    def prepare(
        self, machine: Any, checkpoint: Any, *, once: bool = False, priority: int = 0
    ) -> WorkflowStart: ...


@dataclass(frozen=True)
class Child:
    """A child run of this run, as ``ctx.children`` gives it: what it is and how it ended.

    ``status`` is None while the child is live, then ``completed``, ``failed``
    or ``cancelled``; ``state`` the state it ended in, ``checkpoint`` its
    final checkpoint (decoded as the child machine's type when that machine is
    included in the bus, else the raw JSON bytes), ``error_code``/``error``
    its last error. A child that failed is an outcome here, not an error of the parent.
    """

    machine: str
    key: str
    run_id: int
    status: str | None
    state: str | None
    checkpoint: Any
    error_code: str | None
    error: str | None
    ended_at: datetime | None
    started: bool
    """False when the parent found the key's run already live (or completed) and waited on it."""

    @property
    def ended(self) -> bool:
        return self.status is not None

    @property
    def ok(self) -> bool:
        """The child completed."""
        return self.status == "completed"


def child_of(row: WorkflowChildRow, machines: Mapping[str, Any]) -> Child:
    """A stored child link as a :class:`Child`, its checkpoint decoded when its machine is in ``machines``."""
    checkpoint: Any = row.checkpoint
    m = machines.get(row.machine)
    if m is not None and row.checkpoint is not None:
        try:
            checkpoint = m.decode(row.checkpoint)
        except DecodeError:  # the child's type changed since it ended: its raw JSON
            checkpoint = row.checkpoint
    return Child(
        row.machine, row.key, row.run_id, row.status, row.state, checkpoint, row.error_code, row.error,
        row.ended_at, row.started,
    )  # fmt: skip


class StepContext:
    """One visit of one state: its identity, the signals it may read, the effects it records.

    ``op_key`` is ``machine/key/run/state/visit``: the same for every delivery
    of this visit (a re-run after a crash or a lost lease), different for the
    next visit. Hand it to external providers as the idempotency key.
    """

    __slots__ = (
        "_children", "_compensations", "_connection", "_family", "_may_start", "_signals", "approval",
        "attempt", "consumed", "effects", "key", "machine", "op_key", "priority", "run_id", "starts",
        "state", "version", "visit",
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
    priority: int
    """The run's priority (0 to 9, lower first): every step of the run is published with it."""
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
    starts: list[WorkflowStart]
    """The child runs this visit started (``start``), committed with its transition."""

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
        family: Family | None = None,
        children: tuple[WorkflowChildRow, ...] = (),
        may_start: tuple[str, ...] = (),
    ) -> None:
        self._connection = connection
        self._family = family
        self._children = children
        self._may_start = may_start
        self.starts: list[WorkflowStart] = []
        self.machine = instance.machine
        self.key = instance.key
        self.run_id = instance.run_id
        self.version = instance.version
        self.priority = instance.priority
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

    def start(
        self, machine: Any, checkpoint: Any, *, once: bool = False, priority: int | None = None
    ) -> None:
        """Start a child run of ``machine`` (included in the bus; one of the state's ``children``),
        committed with this visit's transition.

        Nothing starts if the visit raises, runs past its timeout or returns
        something invalid; a visit run again after a crash starts nothing
        twice. As
        ``bus.workflows.start``: a live run of the key is left alone (and, with
        ``once``, a completed one); this run then waits on that run instead.
        The child's end is an outcome this run reads in :attr:`children`.
        ``priority`` is the child run's, for its whole life (None, the default:
        this run's :attr:`priority`, so a run's children keep its place).

        :raises UnknownMachine: the machine is not included in the bus.
        :raises InvalidPriority: ``priority`` is not None or an int from 0 to 9.
        :raises ConfigurationError: the machine is not in the state's
            ``children=``, or the checkpoint is not its type or has a bad key.
        """
        if self._family is None:
            raise ConfigurationError("this context cannot start runs: it belongs to no bus")
        name = machine if isinstance(machine, str) else getattr(machine, "name", machine)
        if name not in self._may_start:
            raise ConfigurationError(
                f"state {self.state!r} of {self.machine!r} starts {name!r}: declare it in children="
            )
        chosen = self.priority if priority is None else priority
        self.starts.append(self._family.prepare(machine, checkpoint, once=once, priority=chosen))

    @property
    def children(self) -> list[Child]:
        """The child runs of this run, in the order they were started (those of this visit excluded)."""
        machines = self._family.machines if self._family is not None else {}
        return [child_of(row, machines) for row in self._children]
