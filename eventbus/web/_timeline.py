"""A run's visits in order, as facts for a table and as a horizontal SVG timeline.

Each history row of the run is one visit (or an operator's action): when it
started and ended, how long it ran, how long the run waited before it since
the previous row ended, and what woke it (``woken_by``, told in words; rows
written before causes were recorded say ``unknown``). The drawing gives each
visit a bar and each wait a gap, both sized on a log scale so a 2 ms visit
and a 3 h wait are both readable; the real durations are written on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ..types import WorkflowHistoryRow
from ..workflows._drawing import element, text
from ..workflows._wake import Wake, describe_wake

__all__ = ["Visit", "duration", "timeline_svg", "visits"]

CHAR_PX = 6.6  # 11 px monospace
FONT = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace"
COLOURS = {"ok": "#12795a", "goto": "#12795a", "yield": "#a15c00", "approval-requested": "#a15c00",
           "approval-wait": "#a15c00", "fail": "#b42318", "error": "#b42318", "timeout": "#b42318",
           "cap": "#b42318", "denied": "#b42318", "expired": "#b42318"}  # fmt: skip
OPERATOR = "#67707a"
DRAWN_VISITS = 40
"""The most visits a timeline draws: a long poll loop shows its latest ones."""


@dataclass(frozen=True)
class Visit:
    """One history row of a run, with the wait before it and its cause."""

    row: WorkflowHistoryRow
    ran_seconds: float
    waited_seconds: float | None
    """Since the previous row of the run ended (None for the first)."""
    wake: Wake

    @property
    def operator(self) -> bool:
        return self.row.actor.startswith("operator:") and self.row.outcome != "denied"


def visits(history: Sequence[WorkflowHistoryRow], run_id: int) -> list[Visit]:
    """The rows of run ``run_id`` in version order, each with its duration, wait and cause."""
    rows = [h for h in history if h.run_id == run_id]
    out: list[Visit] = []
    for i, h in enumerate(rows):
        ran = max(0.0, (h.at - h.started_at).total_seconds())
        waited = None if i == 0 else max(0.0, (h.started_at - rows[i - 1].at).total_seconds())
        wake = describe_wake(h.woken_by)
        if h.woken_by is None and h.actor.startswith("operator:"):
            wake = Wake("operator", h.actor.removeprefix("operator:"))
        out.append(Visit(h, ran, waited, wake))
    return out


def duration(seconds: float | None) -> str:
    """A duration in its largest sensible unit: 4 ms, 2.5 s, 3 min 20 s, 5 h 2 min, 2 d 4 h."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if seconds >= size:
            whole, rest = divmod(int(seconds), size)
            return f"{whole} {unit} {rest // subsize} {sub}" if rest // subsize else f"{whole} {unit}"
    return f"{seconds:.0f} s"


def _scale(seconds: float, base: float) -> float:
    return base + 14.0 * math.log10(1.0 + seconds * 1000.0)


def _w(text: str) -> float:
    return len(text) * CHAR_PX


def timeline_svg(run: Sequence[Visit], now: tuple[str, float] | None = None) -> str:
    """The run as bars (visits) and gaps (waits) left to right; empty when the run has no row yet.

    ``now`` = (status, seconds since the last row) ends a live run's line with its present wait.
    A run of more than :data:`DRAWN_VISITS` rows draws its last ones after a count of the
    earlier (the table under it lists them all).
    """
    if not run:
        return ""
    parts: list[str] = []
    x = 10.0
    earlier = len(run) - DRAWN_VISITS
    if earlier > 0:
        note = f"… {earlier} earlier"
        parts.append(text(note, class_="tl-note", x=x, y=TOP + BAR_H / 2 + 4, fill="#67707a"))
        x += _w(note) + 8
        run = run[earlier:]
    for v in run:  # the wait before each visit and its cause (before the first: the run's start)
        cause, wait = v.wake.text, duration(v.waited_seconds)
        gap = max(_scale(v.waited_seconds or 0.0, 24.0), _w(cause) + 16, _w(wait) + 16)
        title = element("title", escape(f"waited {wait or '—'}; woken by {cause}"))
        parts.append(
            element("g", title + _gap(x, gap, cause, wait, "#2457c5"), class_=f"tl-wait {v.wake.kind}")
        )
        x += gap
        x += _bar(parts, x, v)
    if now is not None:
        label, wait = f"now: {now[0]}", f"{duration(now[1])} so far"
        gap = max(_w(label), _w(wait)) + 24
        parts.append(element("g", _gap(x, gap, label, wait, "#a15c00"), class_="tl-now"))
        x += gap
    width, height = x + 10, TOP + BAR_H + 38
    return element(
        "svg", element("title", "the run's visits in order, the waits between them and what woke each")
        + "".join(parts), xmlns="http://www.w3.org/2000/svg", class_="run-timeline", role="img",
        viewBox=f"0 0 {width:.0f} {height:.0f}", width=f"{width:.0f}", height=f"{height:.0f}",
        font_family=FONT, font_size="11",
    )  # fmt: skip


TOP, BAR_H = 40.0, 22.0


def _gap(x: float, gap: float, label: str, wait: str, colour: str) -> str:
    """A dashed wait of ``gap`` px from ``x``, its cause above the line and its length below."""
    mid, y = x + gap / 2, TOP + BAR_H / 2
    out = element("line", x1=x, y1=y, x2=x + gap - 3, y2=y, stroke="#9aa3ad", stroke_dasharray="3 3")
    out += text(label, class_="tl-cause", x=mid, y=y - 6, text_anchor="middle", fill=colour)
    if wait:
        out += text(wait, class_="tl-note", x=mid, y=y + 15, text_anchor="middle", fill="#67707a")
    return out


def _bar(parts: list[str], x: float, v: Visit) -> float:
    """Append the bar of one visit at ``x`` with its state, outcome and duration; the width it took."""
    name, ran = v.row.state, duration(v.ran_seconds)
    width = max(_scale(v.ran_seconds, 10.0), 14.0)
    colour = OPERATOR if v.operator else COLOURS.get(v.row.outcome, "#2457c5")
    taken = max(width, _w(name), _w(ran), _w(v.row.outcome))
    centre = x + taken / 2
    body = element("title", escape(_visit_title(v)))
    body += text(name, class_="tl-name", x=centre, y=TOP - 8, text_anchor="middle", font_weight="700",
                 fill="#1d232a")  # fmt: skip
    body += element("rect", x=centre - width / 2, y=TOP, width=width, height=BAR_H, rx="3", fill=colour)
    body += text(v.row.outcome, class_="tl-name", x=centre, y=TOP + BAR_H + 14, text_anchor="middle",
                 fill="#1d232a")  # fmt: skip
    body += text(ran, class_="tl-note", x=centre, y=TOP + BAR_H + 28, text_anchor="middle", fill="#67707a")
    parts.append(element("g", body, class_=f"tl-visit {v.row.outcome}"))
    return taken


def _visit_title(v: Visit) -> str:
    h = v.row
    text = f"{h.state} visit {h.visit}: {h.outcome} → {h.next_state}, ran {duration(v.ran_seconds)}"
    if h.error_code or h.error:
        text += f" ({h.error_code or ''} {h.error or ''})".rstrip()
    return text
