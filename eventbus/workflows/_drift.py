"""Definition changes: the table in force against the table in the code, and the live instances it touches.

Workers record the shape of each machine's table (:meth:`Machine.definition`,
by its :attr:`Machine.def_hash`) when they start; the newest one recorded is
the table in force. :func:`report` compares it with the machine as the code
declares it: states added, removed or renamed (``Machine(renamed=…)``), states
whose edges changed, and, from the instance counts, the live instances that
sit in a state that is gone (a problem: no visit can run it), renamed (fine:
the next visit runs the new state) or changed. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..types import WorkflowDefinitionRow
from ._decide import LIVE
from ._machine import Machine

__all__ = ["DefinitionReport", "LiveInstances", "StateChange", "TableChange", "diff", "report"]


@dataclass(frozen=True)
class StateChange:
    """A state (named as the code has it) whose row of the table changed."""

    state: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.state}: {self.before} -> {self.after}"


@dataclass(frozen=True)
class TableChange:
    """What differs between two tables (empty when they are the same)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()
    changed: tuple[StateChange, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.renamed or self.changed)

    def lines(self) -> list[str]:
        """One line per kind of change."""
        out = []
        if self.added:
            out.append("states added: " + ", ".join(self.added))
        if self.removed:
            out.append("states removed: " + ", ".join(self.removed))
        if self.renamed:
            out.append("states renamed: " + ", ".join(f"{old} -> {new}" for old, new in self.renamed))
        out += [f"changed {c}" for c in self.changed]
        return out


@dataclass(frozen=True)
class LiveInstances:
    """Live instances of one (state, status) that a definition change touches.

    ``verdict``: ``gone`` (their state is no longer in the table and no rename
    says where it went: no visit can run them), ``renamed`` (the next visit
    runs the new state) or ``changed`` (their state's row changed: they go on
    by the new edges).
    """

    state: str
    status: str
    count: int
    verdict: str
    detail: str


@dataclass(frozen=True)
class DefinitionReport:
    """A machine's table in the code against the one in force, and the live instances it touches."""

    machine: str
    def_hash: str
    """The hash of the table in the code."""
    stored_hash: str | None
    """The hash of the table in force (recorded by the last worker that started), None when none was."""
    change: TableChange
    live: tuple[LiveInstances, ...]

    @property
    def changed(self) -> bool:
        """The code's table differs from the one in force."""
        return self.stored_hash is not None and self.stored_hash != self.def_hash

    @property
    def problems(self) -> list[str]:
        """One line per (state, status) of live instances in a state the table no longer has."""
        return [
            f"{row.count} {row.status} instance(s) of {self.machine} are in {row.state}, which the table no "
            f"longer has (declare renamed={{{row.state!r}: 'NEW'}} or repoint them)"
            for row in self.live
            if row.verdict == "gone"
        ]

    def lines(self) -> list[str]:
        """The report as text: what changed, then the live instances touched (empty when nothing to say)."""
        out = []
        if self.changed:
            assert self.stored_hash is not None
            out.append(
                f"{self.machine}: the table changed since the one in force "
                f"({self.stored_hash[:12]} -> {self.def_hash[:12]})"
            )
            out += [f"  {line}" for line in self.change.lines()]
        out += [
            f"  {row.count} {row.status} instance(s) in {row.state}: {row.verdict}, {row.detail}"
            for row in self.live
        ]
        if out and not self.changed:
            out.insert(0, f"{self.machine}: live instances touched by a change of the table")
        return out


def _rows(definition: Mapping[str, Any]) -> dict[str, str]:
    """Each state and terminal of a stored or declared table, with its row as text."""
    rows: dict[str, str] = {}
    for name, s in definition.get("states", {}).items():
        edges = ", ".join(f"{label} {target}" for target, label in sorted(s.get("edges", {}).items()))
        flags = (" [initial]" if s.get("initial") else "") + (
            "" if s.get("continue_run", True) else " [yields]"
        )
        rows[name] = f"{edges or 'no edges'}{flags}"
    for name, status in definition.get("terminals", {}).items():
        rows[name] = f"terminal ({status})"
    return rows


def diff(before: Mapping[str, Any], after: Mapping[str, Any], renamed: Mapping[str, str]) -> TableChange:
    """What changed from the table ``before`` to ``after``, given the declared renames (old -> new)."""
    old, new = _rows(before), _rows(after)
    pairs = {o: n for o, n in renamed.items() if o in old and o not in new and n in new}
    moved_to = set(pairs.values())
    same = {name: name for name in old if name in new}
    changed = [
        StateChange(n, old[o], new[n]) for o, n in sorted({**same, **pairs}.items()) if old[o] != new[n]
    ]
    return TableChange(
        added=tuple(sorted(n for n in new if n not in old and n not in moved_to)),
        removed=tuple(sorted(o for o in old if o not in new and o not in pairs)),
        renamed=tuple(sorted(pairs.items())),
        changed=tuple(changed),
    )


def _verdicts(
    m: Machine[Any], change: TableChange, counts: Mapping[tuple[str, str], int]
) -> Iterator[LiveInstances]:
    changed = {c.state: c for c in change.changed}
    for (state, status), n in sorted(counts.items()):
        if status not in LIVE:
            continue
        if state in m.renamed:
            yield LiveInstances(state, status, n, "renamed", f"the next visit runs {m.renamed[state]}")
        elif not m.is_state(state):
            yield LiveInstances(state, status, n, "gone", "no longer in the table and no rename declared")
        elif state in changed:
            yield LiveInstances(
                state, status, n, "changed", f"they go on by the new row ({changed[state].after})"
            )


def report(
    m: Machine[Any], stored: WorkflowDefinitionRow | None, counts: Mapping[tuple[str, str], int]
) -> DefinitionReport:
    """The code's table of ``m`` against ``stored`` (the table in force), with the live instances touched."""
    current = m.def_hash
    change = TableChange()
    if stored is not None and stored.def_hash != current:
        change = diff(stored.definition, m.definition(), m.renamed)
    return DefinitionReport(
        m.name, current, stored.def_hash if stored else None, change, tuple(_verdicts(m, change, counts))
    )
