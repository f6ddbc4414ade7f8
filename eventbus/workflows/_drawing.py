"""The state table drawn as SVG in Python: a layered layout, with no renderer to install.

States are boxes in columns, left to right, by breadth-first distance from
the initial state (a start dot before it); the terminals a run can reach are
boxes with a double border, the machines a state starts are dashed boxes.
An edge to the next column is a straight arrow; an edge that skips columns
runs in a lane above the boxes, an edge back to an earlier column in a lane
below them, an edge within a column curves out to its right, and an edge
back into its own state loops over its corner. Each label sits on its edge,
moved along it when it would cover another label.

Text is measured as a monospace font's advance (0.6 em), so a box is as wide
as its longest line. Every name and label is escaped: a state, signal or
machine name never reaches the markup as markup.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ._diagram import Counts, _child_edges, _edges, _notes, _terminals, shown
from ._machine import Machine

__all__ = ["Box", "Drawing", "Edge", "draw", "element", "layout", "text"]

FONT_PX = 12.0
CHAR_PX = FONT_PX * 0.6
"""The advance of one character of the drawing's monospace font."""
LINE_PX = 16.0
PAD_X, PAD_Y = 10.0, 7.0
GAP_Y = 44.0
"""Between two boxes of a column: room for a loop and its label."""
MIN_GAP_X = 64.0
LANE_PX = 18.0
NOTE_CHARS = 30
BADGE_PX = 22.0
FONT = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace"

Link = Callable[[str, str], str | None]
"""(kind, name) -> the link of a box (kind ``state`` or ``machine``), or None."""


@dataclass
class Box:
    """One node: a state, a terminal, a child machine or the start dot."""

    id: str
    kind: str  # start | state | terminal | child
    name: str
    lines: list[str]
    layer: int = 0
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0
    count: int = 0
    more: bool = False  # a capped count of the box was past its cap: ``count`` is a lower bound
    detail: str = ""
    status: str = ""  # a terminal's run status

    @property
    def badge(self) -> str:
        """The run count as drawn: ``12``, or ``10000+`` for a lower bound."""
        return f"{self.count}+" if self.more else str(self.count)

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass
class Edge:
    """One arrow: from ``source`` to ``target`` box ids, with its label and drawn path."""

    source: str
    target: str
    label: str
    kind: str = "forward"  # forward | skip | back | same | self | child
    path: str = ""
    label_at: tuple[float, float] = (0.0, 0.0)


@dataclass
class Drawing:
    """A laid-out table: boxes by id, edges, and the view box (x, y, width, height)."""

    boxes: dict[str, Box]
    edges: list[Edge]
    view: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    labels: list[tuple[float, float, float, float]] = field(default_factory=list)
    left: list[float] = field(default_factory=list)
    right: list[float] = field(default_factory=list)
    """The left and right edges of each column."""


def _text_w(text: str) -> float:
    return len(text) * CHAR_PX


def _nodes(m: Machine[Any], counts: Counts, cap: int | None) -> tuple[dict[str, Box], list[Edge]]:
    table = _edges(m)
    boxes = {"start": Box("start", "start", "", [], w=14.0, h=14.0)}
    for state in m.states.values():
        notes = [line for note in _notes(state) for line in textwrap.wrap(note, NOTE_CHARS)]
        boxes["s:" + state.name] = Box("s:" + state.name, "state", state.name, notes)
    for terminal in _terminals(m, table):
        boxes["s:" + terminal] = Box("s:" + terminal, "terminal", terminal, [], status=m.terminals[terminal])
    edges = [Edge("start", "s:" + m.initial.name, "")]
    merged: dict[tuple[str, str], list[str]] = {}
    for source, target, label in table:
        merged.setdefault(("s:" + source, "s:" + target), []).append(label)
    # One arrow per pair of states, its labels joined without spaces (a label's halo covers its glyphs only).
    edges += [
        Edge(s, t, "/".join(labels).replace(", ", "/")) for (s, t), labels in merged.items() if t in boxes
    ]
    for source, child in _child_edges(m):
        boxes.setdefault("m:" + child, Box("m:" + child, "child", child, ["child machine"]))
        edges.append(Edge("s:" + source, "m:" + child, "starts, waits", kind="child"))
    for (name, status), n in counts.items():
        box = boxes.get("s:" + name)
        if box is not None and n:
            past = cap is not None and n > cap
            box.count += min(n, cap) if past and cap is not None else n
            box.more = box.more or past
            box.detail = ", ".join(filter(None, [box.detail, f"{shown(n, cap)} {status}"]))
    return boxes, edges


def _size(box: Box) -> None:
    if box.kind == "start":
        return
    badge = BADGE_PX + _text_w(box.badge) if box.count else 0.0
    width = max([_text_w(box.name) + badge, *map(_text_w, box.lines)])
    box.w = max(64.0, width + 2 * PAD_X)
    box.h = (1 + len(box.lines)) * LINE_PX + 2 * PAD_Y


def _layers(boxes: dict[str, Box], edges: list[Edge]) -> list[list[str]]:
    """Breadth-first layers from the start; a box nothing reaches goes after the last."""
    out_edges: dict[str, list[str]] = {}
    for e in edges:
        out_edges.setdefault(e.source, []).append(e.target)
    depth = {"start": 0}
    queue = ["start"]
    for node in queue:
        for nxt in out_edges.get(node, []):
            if nxt not in depth:
                depth[nxt] = depth[node] + 1
                queue.append(nxt)
    for e in edges:  # a terminal goes one column after the furthest state leading into it
        if boxes[e.target].kind == "terminal" and e.source in depth and boxes[e.source].kind != "terminal":
            depth[e.target] = max(depth[e.target], depth[e.source] + 1)
    last = max(depth.values()) + 1
    layers: list[list[str]] = [[] for _ in range(last + 1)]
    for box_id in boxes:
        layers[depth.get(box_id, last)].append(box_id)
    layers = [layer for layer in layers if layer]
    for i, layer in enumerate(layers):
        for box_id in layer:
            boxes[box_id].layer = i
    return _order(layers, edges)


def _order(layers: list[list[str]], edges: list[Edge]) -> list[list[str]]:
    """Each column sorted by the mean row of the boxes leading into it (fewer crossings), twice."""
    col = {b: c for c, layer in enumerate(layers) for b in layer}
    for _ in range(2):
        row = {b: i for layer in layers for i, b in enumerate(layer)}
        for c in range(1, len(layers)):
            layers[c] = sorted(layers[c], key=lambda b: _mean_source(b, edges, row, col))
            row.update({b: i for i, b in enumerate(layers[c])})
    return layers


def _mean_source(box: str, edges: list[Edge], row: dict[str, int], col: dict[str, int]) -> float:
    sources = [row[e.source] for e in edges if e.target == box and col[e.source] < col[box]]
    return sum(sources) / len(sources) if sources else row[box]


def _classify(boxes: dict[str, Box], edges: list[Edge]) -> None:
    for e in edges:
        a, b = boxes[e.source].layer, boxes[e.target].layer
        if e.source == e.target:
            e.kind = "self"
        elif b == a:
            e.kind = "same"
        elif b < a:
            e.kind = "back"
        elif b > a + 1:
            e.kind = "skip"
        elif e.kind != "child":
            e.kind = "forward"


def _place(d: Drawing, layers: list[list[str]]) -> None:
    boxes, edges = d.boxes, d.edges
    heights = [sum(boxes[b].h for b in layer) + GAP_Y * (len(layer) - 1) for layer in layers]
    tallest = max(heights)
    x = 0.0
    for i, layer in enumerate(layers):
        width = max(boxes[b].w for b in layer)
        d.left.append(x)
        d.right.append(x + width)
        y = (tallest - heights[i]) / 2
        for b in layer:
            box = boxes[b]
            box.x, box.y = x + (width - box.w) / 2, y
            y += box.h + GAP_Y
        labels = [
            _text_w(e.label) for e in edges if boxes[e.source].layer == i and e.kind in ("forward", "child")
        ]
        loops = [_text_w(e.label) for e in edges if boxes[e.source].layer == i and e.kind in ("self", "same")]
        lanes = sum(
            1
            for e in edges
            if e.kind in ("skip", "back") and i in (boxes[e.source].layer, boxes[e.target].layer - 1)
        )
        x += width + max(
            [MIN_GAP_X + 10 * lanes, *(w + 28 + 10 * lanes for w in labels), *(w + 30 for w in loops)]
        )


def _border(box: Box, tx: float, ty: float) -> tuple[float, float]:
    """Where the line from the box's centre towards (tx, ty) leaves the box."""
    dx, dy = tx - box.cx, ty - box.cy
    if dx == 0 and dy == 0:
        return box.cx, box.cy
    scale = min(box.w / 2 / abs(dx) if dx else float("inf"), box.h / 2 / abs(dy) if dy else float("inf"))
    return box.cx + dx * scale, box.cy + dy * scale


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def _label_box(e: Edge, at: tuple[float, float]) -> tuple[float, float, float, float]:
    w = _text_w(e.label) + 6
    return at[0] - w / 2, at[1] - LINE_PX / 2 - 1, w, LINE_PX + 2


def _route(d: Drawing) -> None:
    boxes = d.boxes
    top = min(b.y for b in boxes.values()) - (34 if any(e.kind == "self" for e in d.edges) else 0)
    bottom = max(b.y + b.h for b in boxes.values())
    lanes = {"skip": 0, "back": 0}
    ports: dict[tuple[str, str], int] = {}
    for e in d.edges:
        s, t = boxes[e.source], boxes[e.target]
        if e.kind in ("forward", "child"):
            (x1, y1), (x2, y2) = _border(s, t.cx, t.cy), _border(t, s.cx, s.cy)
            e.path = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
            e.label_at = _slide(d, e, (x1, y1), (x2, y2))
        elif e.kind == "self":  # a loop over the top of the box, its label above it
            x0, y0 = s.cx, s.y
            e.path = (
                f"M{x0 - 8:.1f},{y0:.1f} C{x0 - 22:.1f},{y0 - 30:.1f} {x0 + 22:.1f},{y0 - 30:.1f} "
                f"{x0 + 8:.1f},{y0:.1f}"
            )
            e.label_at = _slide(d, e, (x0, y0 - 30), (x0 + 1, y0 - 30))
        elif e.kind == "same":  # out of the right side and back in, bending into the gap
            x0 = s.x + s.w
            bend = max(s.x + s.w, t.x + t.w) + 36
            e.path = (
                f"M{x0:.1f},{s.cy:.1f} C{bend:.1f},{s.cy:.1f} {bend:.1f},{t.cy:.1f} "
                f"{t.x + t.w:.1f},{t.cy:.1f}"
            )
            x = bend - 6 + _text_w(e.label) / 2
            e.label_at = _slide(d, e, (x, s.cy), (x, t.cy))
        elif e.kind == "skip" and _clear(d, e):
            (x1, y1), (x2, y2) = _border(s, t.cx, t.cy), _border(t, s.cx, s.cy)
            e.path = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
            e.label_at = _slide(d, e, (x1, y1), (x2, y2))
        else:
            lanes[e.kind] += 1
            lane = (
                top - 14 - LANE_PX * lanes[e.kind]
                if e.kind == "skip"
                else bottom + 14 + LANE_PX * lanes[e.kind]
            )
            points = [*_leave(d, s, lane, ports), *reversed(_leave(d, t, lane, ports, entering=True))]
            e.path = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points)
            xs = sorted(x for x, y in points if y == lane)
            e.label_at = _slide(d, e, (xs[0], lane), (xs[-1], lane))
        if e.label:
            d.labels.append(_label_box(e, e.label_at))


def _leave(
    d: Drawing, box: Box, lane: float, ports: dict[tuple[str, str], int], entering: bool = False
) -> list[tuple[float, float]]:
    """The points from ``box`` to a lane: straight up or down when nothing in its column is in the
    way, else out of its side into the gap beside its column first (the right side to leave, the
    left to enter). Each use of a side or end takes the next port, so lines never share one."""
    up = lane < box.y
    column = [b for b in d.boxes.values() if b.layer == box.layer and b is not box]
    free = all(b.y > box.y for b in column) if up else all(b.y < box.y for b in column)
    if free:
        k = ports[(box.id, "end")] = ports.get((box.id, "end"), 0) + 1
        x = box.cx + (-1 if entering else 1) * (8 * k - 4)
        edge = box.y if up else box.y + box.h
        return [(x, edge), (x, lane)]
    k = ports[(box.id, "side")] = ports.get((box.id, "side"), 0) + 1
    y = box.cy + (7 if k % 2 else -7) * ((k + 1) // 2)
    side = box.x if entering else box.x + box.w
    gap = d.left[box.layer] - 6 - 5 * k if entering else d.right[box.layer] + 6 + 5 * k
    return [(side, y), (gap, y), (gap, lane)]


def _clear(d: Drawing, e: Edge) -> bool:
    """Whether the straight line of ``e`` misses every other box (by 6 px) and every label."""
    s, t = d.boxes[e.source], d.boxes[e.target]
    others = [(b.x - 6, b.y - 6, b.w + 12, b.h + 12) for b in d.boxes.values() if b is not s and b is not t]
    for i in range(1, 40):
        x, y = s.cx + (t.cx - s.cx) * i / 40, s.cy + (t.cy - s.cy) * i / 40
        if any(r[0] <= x <= r[0] + r[2] and r[1] <= y <= r[1] + r[3] for r in [*others, *d.labels]):
            return False
    return True


def _slide(d: Drawing, e: Edge, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """The first point along a→b (middle first) where the label covers no other label and no box."""
    if not e.label:
        return (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    rects = [(x.x, x.y, x.w, x.h) for x in d.boxes.values()]
    at = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    for t in (0.5, 0.35, 0.65, 0.25, 0.75, 0.42, 0.58):
        at = a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t
        rect = _label_box(e, at)
        if not any(_overlaps(rect, r) for r in [*d.labels, *rects]):
            break
    return at


_POINT = re.compile(r"(-?[0-9.]+),(-?[0-9.]+)")


def _view(d: Drawing) -> tuple[float, float, float, float]:
    xs: list[float] = []
    ys: list[float] = []
    for b in d.boxes.values():
        xs += [b.x, b.x + b.w]
        ys += [b.y - (8 if b.count else 0), b.y + b.h]
    for x, y, w, h in d.labels:
        xs += [x, x + w]
        ys += [y, y + h]
    for e in d.edges:  # every point of every path (a curve's control points bound it)
        for x, y in _POINT.findall(e.path):
            xs.append(float(x))
            ys.append(float(y))
    pad = 10.0
    return min(xs) - pad, min(ys) - pad, max(xs) - min(xs) + 2 * pad, max(ys) - min(ys) + 2 * pad


def layout(m: Machine[Any], counts: Counts | None = None, cap: int | None = None) -> Drawing:
    """Boxes, edges and paths of ``m``'s table; ``counts`` (state, status) -> runs go on the boxes.

    ``cap``: the counts were read capped there; a box with a count past it shows ``N+``.
    """
    boxes, edges = _nodes(m, counts or {}, cap)
    for box in boxes.values():
        _size(box)
    layers = _layers(boxes, edges)
    _classify(boxes, edges)
    d = Drawing(boxes, edges)
    _place(d, layers)
    _route(d)
    d.view = _view(d)
    return d


def element(tag: str, body: str = "", /, **attrs: object) -> str:
    """One SVG element: attributes escaped (``_`` in a name is ``-``), numbers to 0.1 px.

    ``body`` is markup, as given: text in it is escaped by the caller (see :func:`text`).
    """
    parts = [tag]
    for name, value in attrs.items():
        if value is None:
            continue
        text = f"{value:.1f}" if isinstance(value, float) else str(value)
        parts.append(f'{name.rstrip("_").replace("_", "-")}="{escape(text)}"')
    return f"<{' '.join(parts)}>{body}</{tag}>"


def text(body: str, /, **attrs: object) -> str:
    """A ``<text>`` element; ``body`` is escaped."""
    return element("text", escape(body), **attrs)


ARROW = (
    '<defs><marker id="md-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
    'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="md-head" fill="#56606b"/>'
    "</marker></defs>"
)


def draw(
    m: Machine[Any],
    counts: Counts | None = None,
    current: str | None = None,
    link: Link | None = None,
    *,
    cap: int | None = None,
) -> str:
    """``m``'s table as one ``<svg>`` element; ``current`` names the state (or terminal) to highlight.

    ``cap``: the counts were read capped there; a count past it shows as ``cap+``.
    """
    d = layout(m, counts, cap)
    vx, vy, vw, vh = d.view
    out = [element("title", escape(f"{m.name}: states and transitions")), ARROW]
    for e in d.edges:
        dashed = e.kind == "child" or "cap" in e.label or "timeout" in e.label
        out.append(element(
            "path", element("title", escape(_edge_title(d, e))), d=e.path, class_=f"md-edge {e.kind}",
            fill="none", stroke="#56606b", stroke_width="1.3", stroke_dasharray="4 3" if dashed else None,
            marker_end="url(#md-arrow)",
        ))  # fmt: skip
    out += [_box(box, box.kind != "start" and box.name == current, link) for box in d.boxes.values()]
    for e in d.edges:
        if e.label:
            x, y = e.label_at
            bx, by, bw, bh = _label_box(e, e.label_at)
            back = element("rect", x=bx, y=by + 1, width=bw, height=bh - 2, rx="3", fill="#fff")
            label = text(e.label, x=x, y=y + 4, text_anchor="middle", fill="#3b434c", font_size="11")
            # the plate and the text take the page's colours from the dashboard's stylesheet
            out.append(element("g", back + label, class_="md-label"))
    return element(
        "svg", "\n".join(out), xmlns="http://www.w3.org/2000/svg", class_="machine-diagram", role="img",
        viewBox=f"{vx:.0f} {vy:.0f} {vw:.0f} {vh:.0f}", width=f"{vw:.0f}", height=f"{vh:.0f}",
        font_family=FONT, font_size=f"{FONT_PX:g}",
    )  # fmt: skip


def _edge_title(d: Drawing, e: Edge) -> str:
    s, t = d.boxes[e.source], d.boxes[e.target]
    return f"{s.name or 'start'} → {t.name}" + (f" ({e.label})" if e.label else "")


_STROKE = {"completed": "#12795a", "failed": "#b42318", "cancelled": "#67707a"}


def _box(box: Box, current: bool, link: Link | None) -> str:
    if box.kind == "start":
        return element("circle", class_="md-start", cx=box.cx, cy=box.cy, r="7", fill="#1d232a")
    cls = f"md-box {box.kind}" + (f" {box.status}" if box.status else "") + (" current" if current else "")
    stroke = _STROKE.get(box.status, "#56606b")
    parts = [element("title", escape(_box_title(box)))]
    parts.append(element(
        "rect", class_="md-frame", x=box.x, y=box.y, width=box.w, height=box.h, rx="6",
        fill="#e8effc" if current else "#fff",
        stroke="#2457c5" if current else stroke, stroke_width="2.5" if current else "1.3",
        stroke_dasharray="5 3" if box.kind == "child" else None,
    ))  # fmt: skip
    if box.kind == "terminal":
        parts.append(element(
            "rect", class_="md-inner", x=box.x + 3, y=box.y + 3, width=box.w - 6, height=box.h - 6, rx="4",
            fill="none",
            stroke=stroke, stroke_width="1",
        ))  # fmt: skip
    y = box.y + PAD_Y + LINE_PX - 4
    name = text(box.name, class_="md-name", x=box.x + PAD_X, y=y, font_weight="700", fill="#1d232a")
    href = link("machine" if box.kind == "child" else box.kind, box.name) if link else None
    parts.append(element("a", name, href=href) if href else name)
    for line in box.lines:
        y += LINE_PX
        parts.append(text(line, class_="md-note", x=box.x + PAD_X, y=y, fill="#67707a", font_size="11"))
    if box.count:
        w = BADGE_PX + _text_w(box.badge) - 8
        bx = box.x + box.w - PAD_X + 4 - w
        badge = element("rect", x=bx, y=box.y + 5, width=w, height="18", rx="9", fill="#2457c5")
        badge += text(box.badge, x=bx + w / 2, y=box.y + 18, text_anchor="middle", fill="#fff",
                      font_size="11", font_weight="700")  # fmt: skip
        parts.append(element("g", badge, class_="md-count"))
    return element("g", "".join(parts), class_=cls)


def _box_title(box: Box) -> str:
    kind = {"state": "state", "terminal": f"terminal ({box.status})", "child": "child machine"}[box.kind]
    runs = f": {box.badge} run(s) here ({box.detail})" if box.count else ""
    return f"{kind} {box.name}{runs}"
