"""Diagrams drawn from the registered state table (Mermaid, Graphviz dot, or SVG drawn here).

The diagram is the table: yield points, visit caps, ages, approval and
signal edges, the built-in terminals a cap or an approval can reach, and
child edges to the machines a state starts (drawn as nodes of their own).
With live counts, each state shows how many instances are in it, by status;
counts read with a cap show past it as ``N+`` (see :func:`shown`).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError
from ._machine import MAX_RETRIES, Machine, State, seconds

__all__ = ["diagram"]

Counts = dict[tuple[str, str], int]


def shown(n: int, cap: int | None) -> str:
    """A count as drawn: ``n``, or ``cap+`` when a capped read found more than ``cap``."""
    return f"{cap}+" if cap is not None and n > cap else str(n)


def _duration(value: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s"


def _notes(state: State) -> list[str]:
    notes = []
    if not state.continue_run:
        notes.append(f"yields, poll {_duration(state.poll)}" if state.poll else "yields")
    if state.max_visits is not None:
        notes.append(f"max {state.max_visits} visits")
    if state.max_age is not None:
        notes.append(f"max age {_duration(state.max_age)}")
    if state.timeout is not None:
        notes.append(f"timeout {_duration(state.timeout)}")
    if state.wake_on:
        notes.append("wakes on " + ", ".join(state.wake_on))
    if state.approval is not None:
        notes.append(f"approval, timeout {_duration(seconds(state.approval.timeout) or 0.0)}")
    if state.children:
        notes.append("children " + ", ".join(state.children))
    return notes


def _live(name: str, counts: Counts | None, cap: int | None) -> str:
    if not counts:
        return ""
    parts = [f"{shown(n, cap)} {status}" for (state, status), n in sorted(counts.items()) if state == name]
    return f"[{', '.join(parts)}]" if parts else ""


def _edges(m: Machine[Any]) -> list[tuple[str, str, str]]:
    edges: list[tuple[str, str, str]] = []
    for state in m.states.values():
        for target, label in state.edges().items():
            edges.append((state.name, target, label))
        if state.capped:
            edges.append((state.name, MAX_RETRIES, "cap"))
    return edges


def _child_edges(m: Machine[Any]) -> list[tuple[str, str]]:
    """(state, child machine) for each machine a state starts, in declaration order."""
    return [(state.name, child) for state in m.states.values() for child in state.children]


def _child_node(child: str) -> str:
    return "child_" + child.replace("-", "_")


def _terminals(m: Machine[Any], edges: list[tuple[str, str, str]]) -> list[str]:
    used = {target for _, target, _ in edges}
    return [t for t in m.terminals if t in used]


def diagram(
    m: Machine[Any], fmt: str = "mermaid", counts: Counts | None = None, *, cap: int | None = None
) -> str:
    """Render ``m``'s table as ``mermaid``, ``dot`` or ``svg``; ``counts`` adds instances per state.

    ``cap``: the counts were read capped there (``counts(m, cap=...)``); a
    count past it shows as ``cap+``.
    """
    if fmt == "svg":
        from ._drawing import draw  # the drawing reads this module's table helpers

        return draw(m, counts, cap=cap) + "\n"
    if fmt == "mermaid":
        return _mermaid(m, counts, cap)
    if fmt == "dot":
        return _dot(m, counts, cap)
    raise ConfigurationError(f"unknown diagram format {fmt!r}: use mermaid, dot or svg")


def _mermaid(m: Machine[Any], counts: Counts | None, cap: int | None = None) -> str:
    edges = _edges(m)
    lines = ["stateDiagram-v2", f"    [*] --> {m.initial.name}"]
    for state in m.states.values():
        for note in [*_notes(state), _live(state.name, counts, cap)]:
            if note:
                lines.append(f"    {state.name} : {note}")
    for source, target, label in edges:
        lines.append(f"    {source} --> {target} : {label}")
    for terminal in _terminals(m, edges):
        live = _live(terminal, counts, cap)
        if live:
            lines.append(f"    {terminal} : {live}")
        lines.append(f"    {terminal} --> [*]")
    children = _child_edges(m)
    for child in dict.fromkeys(c for _, c in children):
        lines.append(f'    state "machine {child}" as {_child_node(child)}')
    for source, child in children:
        lines.append(f"    {source} --> {_child_node(child)} : starts, waits")
    return "\n".join(lines) + "\n"


def _dot(m: Machine[Any], counts: Counts | None, cap: int | None = None) -> str:
    edges = _edges(m)
    lines = [f'digraph "{m.name}" {{', "    rankdir=LR;", "    start [shape=point];"]
    for state in m.states.values():
        label = "\\n".join([state.name, *_notes(state), _live(state.name, counts, cap)]).rstrip("\\n")
        shape = "box, style=dashed" if not state.continue_run else "box"
        lines.append(f'    {state.name} [shape={shape}, label="{label}"];')
    for terminal in _terminals(m, edges):
        label = "\\n".join([terminal, _live(terminal, counts, cap)]).rstrip("\\n")
        lines.append(f'    {terminal} [shape=doublecircle, label="{label}"];')
    lines.append(f"    start -> {m.initial.name};")
    for source, target, label in edges:
        style = ", style=dashed" if label in ("cap", "timeout", "denied", "goto") else ""
        lines.append(f'    {source} -> {target} [label="{label}"{style}];')
    children = _child_edges(m)
    for child in dict.fromkeys(c for _, c in children):
        lines.append(f'    {_child_node(child)} [shape=component, label="machine {child}"];')
    for source, child in children:
        lines.append(f'    {source} -> {_child_node(child)} [label="starts, waits", style=dotted];')
    lines.append("}")
    return "\n".join(lines) + "\n"
