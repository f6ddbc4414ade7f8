"""The state table: states, edges, caps, terminals, and the checks made at registration."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from ..errors import (
    CheckpointTooLarge,
    ConfigurationError,
    DecodeError,
    DefinitionError,
    InvalidCheckpoint,
    UncappedCycle,
    UndeclaredState,
    UnreachableState,
)
from ..event import Event
from ..types import WorkflowEffectRow
from ._outcomes import Outcome, seconds

if TYPE_CHECKING:
    from ._context import StepContext

__all__ = [
    "BUILT_IN_TERMINALS",
    "CANCELLED",
    "COMPENSATING",
    "FAILED",
    "MAX_RETRIES",
    "UNCERTAIN",
    "Approval",
    "Machine",
    "State",
    "StepEvent",
    "seconds",
]

C = TypeVar("C", bound=msgspec.Struct)
StateFn = Callable[[Any, "StepContext"], Awaitable[Outcome]]
CompensateFn = Callable[[Any, WorkflowEffectRow, "StepContext"], Awaitable[None]]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
E = TypeVar("E", bound=Event)

MAX_RETRIES = "MAX_RETRIES"
"""The built-in terminal a run ends in when a state's ``max_visits`` or a ``max_age`` is reached."""
FAILED = "FAILED"
"""The built-in failure terminal."""
CANCELLED = "CANCELLED"
"""The built-in terminal of a cancelled run."""
UNCERTAIN = "UNCERTAIN"
"""Where an instance stops for a human to resolve: an ``Uncertain`` outcome, or failing compensations."""
COMPENSATING = "COMPENSATING"
"""The state whose visits run a failed run's compensations, in reverse."""
BUILT_IN_TERMINALS = {MAX_RETRIES: "failed", FAILED: "failed", CANCELLED: "cancelled"}
"""Terminal states every machine has, with the status an instance ends in."""

_MACHINE_RE = re.compile(r"^[a-z][a-z0-9_\-]{0,62}$")
_STATE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")


class StepEvent(Event, frozen=True):
    """Fields of the internal step event; each machine has its own event type."""

    key: str
    version: int
    reason: str = ""


class StartEvent(Event, frozen=True):
    """Fields of the internal start event a schedule fires: the encoded checkpoint."""

    checkpoint: str


@dataclass(frozen=True)
class Approval:
    """A state that runs only once a human approved its exact input.

    :param timeout: how long the request stays open; then the ``on_timeout`` edge.
    :param on_deny: the edge taken when the approval is denied.
    :param input: what is approved, from the checkpoint (default: the whole
        checkpoint); its hash binds the decision, so a changed input needs a
        new approval.
    """

    timeout: timedelta | float
    on_deny: str
    on_timeout: str
    input: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        seconds(self.timeout)

    def input_of(self, checkpoint: Any) -> bytes:
        return msgspec.json.encode(checkpoint if self.input is None else self.input(checkpoint))

    @staticmethod
    def hash_of(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class State:
    """One row of the state table."""

    name: str
    fn: StateFn
    on_success: str
    on_failure: str
    also: tuple[str, ...] = ()
    continue_run: bool = True
    poll: float | None = None
    max_visits: int | None = None
    max_age: float | None = None
    wake_on: tuple[str, ...] = ()
    approval: Approval | None = None
    initial: bool = False
    timeout: float | None = None
    """Seconds one visit's function may run before it is cancelled (its failure edge, outcome ``timeout``)."""
    transactional: bool = False
    """The state writes through ``ctx.connection``, in the transaction its transition commits in."""
    children: tuple[str, ...] = ()
    """The machines whose runs this state starts (``ctx.start``) or waits on (``Yield(children=...)``)."""

    def edges(self) -> dict[str, str]:
        """Every target this state can move to, with the label(s) of its edge."""
        out: dict[str, list[str]] = {}
        pairs = [(self.on_success, "success"), (self.on_failure, "failure")]
        pairs += [(t, "goto") for t in self.also]
        if self.approval is not None:
            pairs += [(self.approval.on_deny, "denied"), (self.approval.on_timeout, "timeout")]
        for target, label in pairs:
            if label not in out.setdefault(target, []):
                out[target].append(label)
        return {target: ", ".join(labels) for target, labels in out.items()}

    @property
    def capped(self) -> bool:
        return self.max_visits is not None or self.max_age is not None

    def shape(self) -> dict[str, Any]:
        """The state's row in :meth:`Machine.definition` (its child machines only when it has some)."""
        out: dict[str, Any] = {
            "edges": self.edges(),
            "initial": self.initial,
            "continue_run": self.continue_run,
        }
        if self.children:
            out["children"] = list(self.children)
        return out


@dataclass
class Machine(Generic[C]):
    """A durable state machine over a typed checkpoint, one instance per key.

    :param name: stable name (lower case, digits, ``_`` and ``-``): stored with
        every instance and part of the internal step event type.
    :param checkpoint: the msgspec Struct a state mutates; committed with each transition.
    :param key: the instance key of a checkpoint (one live run per key).
    :param max_checkpoint_bytes: a transition whose encoded checkpoint is larger
        takes the failure edge (``checkpoint-too-large``) and keeps the old one.
    :param max_age: a cap on the whole run's age; past it the run ends in ``MAX_RETRIES``.
    :param lease_seconds: lease of a visit's delivery (renewed while it runs); a
        state's ``timeout_seconds`` must be at most half of it.
    :param compensation_attempts: tries per compensation before the instance is ``uncertain``.
    :param compensation_retry_seconds: the first wait before a failed compensation is tried again (doubling).
    :param sweep_interval: how often the sweep for lost ticks runs (seconds).
    :param sweep_grace: how overdue an instance with no step must be to be swept.
    :param renamed: old state name -> new one, for instances still pointing at the old name.
    """

    name: str
    checkpoint: type[C]
    key: Callable[[C], str]
    max_checkpoint_bytes: int = 64 * 1024
    max_age: timedelta | float | None = None
    lease_seconds: float = 60.0
    compensation_attempts: int = 3
    compensation_retry_seconds: float = 1.0
    sweep_interval: float = 60.0
    sweep_grace: float = 30.0
    renamed: dict[str, str] = field(default_factory=dict)
    states: dict[str, State] = field(default_factory=dict, init=False)
    terminals: dict[str, str] = field(default_factory=dict, init=False)
    compensations: dict[str, CompensateFn] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not _MACHINE_RE.match(self.name):
            raise ConfigurationError(
                f"invalid machine name {self.name!r}: use lower-case letters, digits, _ and - (at most 63)"
            )
        if not (isinstance(self.checkpoint, type) and issubclass(self.checkpoint, msgspec.Struct)):
            raise ConfigurationError("checkpoint must be a msgspec.Struct class")
        self.terminals.update(BUILT_IN_TERMINALS)
        self._decoder = msgspec.json.Decoder(self.checkpoint)
        self.step_class: type[StepEvent] = _internal_class(StepEvent, f"wf.step.{self.name}")
        self.start_class: type[StartEvent] = _internal_class(StartEvent, f"wf.start.{self.name}")

    @property
    def event_type(self) -> str:
        return f"wf.step.{self.name}"

    @property
    def run_max_age(self) -> float | None:
        return seconds(self.max_age)

    # -- declaring -----------------------------------------------------------

    def state(
        self,
        *,
        on_success: str,
        on_failure: str,
        initial: bool = False,
        also: tuple[str, ...] = (),
        continue_run: bool = True,
        poll: timedelta | float | None = None,
        max_visits: int | None = None,
        max_age: timedelta | float | None = None,
        wake_on: str | tuple[str, ...] = (),
        approval: Approval | None = None,
        name: str | None = None,
        timeout_seconds: float | None = None,
        transactional: bool = False,
        children: str | Machine[Any] | tuple[str | Machine[Any], ...] = (),
    ) -> Callable[[F], F]:
        """Declare the decorated ``async def STATE(checkpoint, ctx)`` as a state (named after it).

        ``timeout_seconds`` bounds one visit: a state function still running
        then is cancelled and the visit takes ``on_failure`` with the outcome
        ``timeout`` (error code ``timeout``) in the history, keeping the
        checkpoint it read. It counts as a visit (``max_visits`` caps a state
        that times out again and again) and is not a delivery retry. It must be
        positive, finite and at most half the machine's ``lease_seconds``, so a
        visit ends and commits well inside its lease even if renewal stalls.

        With ``transactional=True`` the state gets ``ctx.connection`` inside the
        transaction its transition commits in: its writes commit with the
        transition or not at all, and a state that raises (or runs past its
        ``timeout_seconds``, by default
        :data:`~eventbus.router.TRANSACTIONAL_TIMEOUT_SECONDS`) rolls them back.

        ``children`` names the machines (or their names) whose runs the state
        starts with ``ctx.start`` and waits on with ``Yield(children=...)``:
        the diagram draws them as child edges, and ``ctx.start`` of another
        machine is refused. A yielding state with children needs no ``poll``.
        """
        if max_visits is not None and max_visits < 1:
            raise DefinitionError("max_visits must be at least 1")
        timeout = _timeout(timeout_seconds, self.lease_seconds, name or "this state")
        kids = _children(children)

        def decorate(fn: F) -> F:
            state_name = name or fn.__name__
            self._check_new(state_name)
            self.states[state_name] = State(
                name=state_name,
                fn=fn,
                on_success=on_success,
                on_failure=on_failure,
                also=tuple(also),
                continue_run=continue_run,
                poll=seconds(poll),
                max_visits=max_visits,
                max_age=seconds(max_age),
                wake_on=(wake_on,) if isinstance(wake_on, str) else tuple(wake_on),
                approval=approval,
                initial=initial,
                timeout=timeout,
                transactional=transactional,
                children=kids,
            )
            return fn

        return decorate

    def terminal(self, name: str, *, failed: bool = False) -> None:
        """Declare a terminal state: the run ends there, ``completed`` (or ``failed``)."""
        self._check_new(name)
        self.terminals[name] = "failed" if failed else "completed"

    def compensation(self, fn: F) -> F:
        """Register ``async def undo(checkpoint, effect, ctx)`` for ``ctx.record_effect(compensate=undo)``.

        ``effect`` is the :class:`~eventbus.types.WorkflowEffectRow` recorded
        (its ``ref`` decoded, as given to ``record_effect``).
        """
        self.compensations[fn.__name__] = fn
        return fn

    def _check_new(self, name: str) -> None:
        if not _STATE_RE.match(name):
            raise DefinitionError(f"invalid state name {name!r}: use letters, digits and _")
        if name in self.states or name in self.terminals or name in (UNCERTAIN, COMPENSATING):
            raise DefinitionError(f"machine {self.name!r} already has a state named {name!r}")

    # -- reading ------------------------------------------------------------------

    @property
    def initial(self) -> State:
        found = [s for s in self.states.values() if s.initial]
        if len(found) != 1:
            raise DefinitionError(f"machine {self.name!r} needs exactly one initial state, has {len(found)}")
        return found[0]

    def lookup(self, name: str) -> State | None:
        """The state of that name, following ``renamed``."""
        return self.states.get(name) or self.states.get(self.renamed.get(name, ""))

    def definition(self) -> dict[str, Any]:
        """The shape of the table: each state's edges (labelled), initial and yield flags, and the terminals.

        Caps, polls, timeouts and the functions are left out: changing them
        leaves every instance where it can go on. Renames are left out too: a
        declared rename is how a changed shape is made safe, not a change.
        """
        return {
            "states": {name: s.shape() for name, s in self.states.items()},
            "terminals": dict(self.terminals),
        }

    @property
    def def_hash(self) -> str:
        """The SHA-256 of :meth:`definition` (keys sorted): the same table has the same hash everywhere."""
        return hashlib.sha256(msgspec.json.encode(self.definition(), order="sorted")).hexdigest()

    def is_state(self, name: str) -> bool:
        """Whether ``name`` is a state of the table, a terminal or a built-in state."""
        return name in self.states or name in self.terminals or name in (UNCERTAIN, COMPENSATING)

    def encode(self, checkpoint: C) -> bytes:
        """The checkpoint as stored; :class:`CheckpointTooLarge` over the bound.

        :class:`InvalidCheckpoint` when it would not decode again: msgspec
        encodes a field of the wrong type (a str in an ``int`` field) that every
        later visit would then fail to read, so the round trip is checked here.
        """
        try:
            data = msgspec.json.encode(checkpoint)
        except (TypeError, ValueError) as exc:
            raise InvalidCheckpoint(f"checkpoint of {self.name!r} does not encode: {exc}") from exc
        if len(data) > self.max_checkpoint_bytes:
            raise CheckpointTooLarge(
                f"checkpoint of {self.name!r} is {len(data)} bytes, over max_checkpoint_bytes="
                f"{self.max_checkpoint_bytes}"
            )
        try:
            self._decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise InvalidCheckpoint(f"checkpoint of {self.name!r} does not match its type: {exc}") from exc
        return data

    def decode(self, data: bytes) -> C:
        """A stored checkpoint; :class:`DecodeError` if it does not match the checkpoint type."""
        try:
            return self._decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise DecodeError(f"checkpoint of {self.name!r} does not decode: {exc}") from exc

    # -- registration checks ---------------------------------------------------------

    def check(self) -> None:
        """Refuse a table with an undeclared edge, an unreachable state or an uncapped cycle."""
        initial = self.initial
        for state in self.states.values():
            _timeout(state.timeout, self.lease_seconds, state.name)
            if not state.continue_run and state.poll is None and not state.wake_on and not state.children:
                raise DefinitionError(
                    f"state {state.name} yields (continue_run=False) but has no poll, wake_on or children"
                )
            for target in state.edges():
                if target not in self.states and target not in self.terminals:
                    raise UndeclaredState(f"state {state.name} has an edge to undeclared state {target!r}")
        self._check_renames()
        seen = set(self._reachable(initial.name))
        unreachable = sorted(
            n for n in [*self.states, *self.terminals] if n not in seen and n not in BUILT_IN_TERMINALS
        )
        if unreachable:
            raise UnreachableState(
                f"machine {self.name!r}: unreachable from {initial.name}: {', '.join(unreachable)}"
            )
        if self.run_max_age is None:
            cycle = self._uncapped_cycle()
            if cycle:
                raise UncappedCycle(
                    f"machine {self.name!r}: the cycle {' -> '.join(cycle)} passes no state with "
                    "max_visits or max_age, so a run might never end"
                )

    def _check_renames(self) -> None:
        for old, new in self.renamed.items():
            if self.is_state(old):
                raise DefinitionError(
                    f"machine {self.name!r} renames {old} to {new} but still has a state {old}"
                )
            if new not in self.states:
                raise UndeclaredState(
                    f"machine {self.name!r} renames {old} to {new!r}, which is not a non-terminal state"
                )

    def _reachable(self, start: str) -> Iterator[str]:
        stack, seen = [start], {start}
        while stack:
            name = stack.pop()
            yield name
            state = self.states.get(name)
            for target in state.edges() if state else ():
                if target not in seen:
                    seen.add(target)
                    stack.append(target)

    def _uncapped_cycle(self) -> list[str]:
        """A cycle through uncapped states only (empty when there is none)."""
        graph = {
            n: [t for t in s.edges() if t in self.states and not self.states[t].capped]
            for n, s in self.states.items()
            if not s.capped
        }
        colour: dict[str, int] = {}
        for root in graph:
            if root in colour:
                continue
            path, stack = [root], [iter(graph[root])]
            colour[root] = 1
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    colour[path.pop()] = 2
                    stack.pop()
                elif colour.get(nxt) == 1:
                    return [*path[path.index(nxt) :], nxt]
                elif nxt not in colour:
                    colour[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(graph[nxt]))
        return []


def _timeout(value: object, lease_seconds: float, state: str) -> float | None:
    """A checked ``timeout_seconds``: positive, finite, at most half the lease (else ``DefinitionError``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DefinitionError(
            f"timeout_seconds of {state} is a number of seconds, not {type(value).__name__}"
        )
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise DefinitionError(f"timeout_seconds of {state} must be a positive, finite number, got {out}")
    if out > lease_seconds / 2:
        raise DefinitionError(
            f"timeout_seconds={out:g} of {state} is over half the machine's lease_seconds={lease_seconds:g}: "
            f"raise Machine(lease_seconds=...) to at least {2 * out:g}"
        )
    return out


def _children(value: object) -> tuple[str, ...]:
    """The names of a state's child machines: a machine, a name, or a tuple of them."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    names = []
    for item in items:
        name = item.name if isinstance(item, Machine) else item
        if not isinstance(name, str) or not _MACHINE_RE.match(name):
            raise DefinitionError(f"children are machines or machine names, not {item!r}")
        names.append(name)
    return tuple(dict.fromkeys(names))


def _internal_class(base: type[E], event_type: str) -> type[E]:
    """An internal event type of its own per machine (its own subscription)."""
    meta: Any = type(base)
    namespace = {"__module__": __name__, "__qualname__": f"{base.__name__}[{event_type}]"}
    cls: type[E] = meta(base.__name__, (base,), namespace, event_type=event_type, frozen=True)
    return cls
