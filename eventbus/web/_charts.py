"""The ``/charts`` page: throughput, failures, backlog and handler durations, drawn as inline SVG.

The numbers come from :meth:`eventbus.Bus.throughput` (the rollup the workers
keep, never the deliveries). This module turns them into chart geometry
(:class:`Chart`: bars, lines, ticks, a legend, in the SVG's own units); the
template ``_svg.html`` draws it, escaping every text. No script and no
library: the page is complete as the server sends it.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..throughput import WINDOWS, Throughput, ThroughputPoint
from . import _filters as f
from ._render import Pages, seconds

__all__ = ["Chart", "bar_chart", "duration_chart", "line_chart", "routes", "sparkline"]

WIDTH, HEIGHT = 720, 210
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 26
"""The plot area's margins: the y labels on the left, the times below."""


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: str
    """A CSS class: the series' colour."""


@dataclass
class Column:
    """The bars of one step, stacked, with what a pointer over them reads."""

    title: str
    bars: list[Bar] = field(default_factory=list)


@dataclass
class Line:
    series: str
    segments: list[str]
    """``points`` attributes of polylines (a gap where a step has no value)."""
    dots: list[tuple[float, float]]
    """Values with no neighbour, drawn as a dot."""


@dataclass
class Chart:
    """What ``_svg.html`` draws."""

    id: str
    title: str
    description: str
    legend: list[tuple[str, str]]
    """(series class, label)."""
    width: int = WIDTH
    height: int = HEIGHT
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    empty: bool = False

    @property
    def plot(self) -> tuple[int, int, int, int]:
        """The plot area: left, top, right, bottom."""
        return LEFT, TOP, self.width - RIGHT, self.height - BOTTOM


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """0 and round steps (1, 2 or 5 times a power of ten) up to at least ``top``."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _count_label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _x_ticks(chart: Chart, points: Sequence[ThroughputPoint]) -> list[tuple[float, str]]:
    """A time label every ten minutes (hour) or three hours (day), at the step's left edge."""
    if len(points) < 2:
        return []
    left, _, right, _ = chart.plot
    step = (points[1].start - points[0].start).total_seconds()
    every = 600 if step <= 60 else 3 * 3600
    width = (right - left) / len(points)
    return [
        (left + i * width, p.start.strftime("%H:%M"))
        for i, p in enumerate(points)
        if int(p.start.timestamp()) % every == 0
    ]


def _frame(
    chart: Chart, points: Sequence[ThroughputPoint], top: float, label: Callable[[float], str]
) -> float:
    """Ticks of a linear y axis up to ``top`` and the time axis; returns the axis' top value."""
    ticks = nice_ticks(top)
    _, y0, _, y1 = chart.plot
    chart.y_ticks = [(y1 - (y1 - y0) * t / ticks[-1], label(t)) for t in ticks]
    chart.x_ticks = _x_ticks(chart, points)
    return ticks[-1]


BAR_SERIES = (("completed", "completed"), ("failed", "failed, to retry"), ("dead", "dead-lettered"))


def bar_chart(chart_id: str, title: str, points: Sequence[ThroughputPoint]) -> Chart:
    """Completed, failed and dead runs per step, stacked."""
    chart = Chart(chart_id, title, "", list(BAR_SERIES))
    totals = [p.completed + p.failed + p.dead for p in points]
    chart.empty = not any(totals)
    axis_top = _frame(chart, points, max(totals, default=0), _count_label)
    left, y0, right, y1 = chart.plot
    width = (right - left) / max(len(points), 1)
    scale = (y1 - y0) / axis_top
    for i, p in enumerate(points):
        column, base = Column(_bar_title(p)), float(y1)
        for series, _ in BAR_SERIES:
            value = getattr(p, series)
            if value:
                base -= value * scale
                column.bars.append(
                    Bar(left + i * width + 0.5, base, max(width - 1, 0.5), value * scale, series)
                )
        chart.columns.append(column)
    done, failed, dead = (sum(getattr(p, s) for p in points) for s, _ in BAR_SERIES)
    chart.description = f"{done:,} completed, {failed:,} failed, {dead:,} dead-lettered in the window"
    return chart


def _bar_title(p: ThroughputPoint) -> str:
    return f"{p.start:%H:%M} UTC: {p.completed:,} completed, {p.failed:,} failed, {p.dead:,} dead"


def _line(series: str, xy: Sequence[tuple[float, float] | None]) -> Line:
    """A line through the values, broken where a step has none."""
    runs: list[list[tuple[float, float]]] = [[]]
    for point in xy:
        if point is None:
            runs.append([])
        else:
            runs[-1].append(point)
    runs = [r for r in runs if r]
    segments = [" ".join(f"{x:.1f},{y:.1f}" for x, y in r) for r in runs if len(r) > 1]
    return Line(series, segments, [r[0] for r in runs if len(r) == 1])


def _centres(chart: Chart, n: int) -> list[float]:
    left, _, right, _ = chart.plot
    width = (right - left) / max(n, 1)
    return [left + (i + 0.5) * width for i in range(n)]


def line_chart(
    chart_id: str,
    title: str,
    points: Sequence[ThroughputPoint],
    series: Sequence[tuple[str, str, Callable[[ThroughputPoint], float | None]]],
    label: Callable[[float], str] = _count_label,
) -> Chart:
    """One line per (class, label, value) series on a linear axis from zero."""
    chart = Chart(chart_id, title, "", [(s, lbl) for s, lbl, _ in series])
    values = [[get(p) for p in points] for _, _, get in series]
    present = [v for vs in values for v in vs if v is not None]
    chart.empty = not present
    axis_top = _frame(chart, points, max(present, default=0.0), label)
    _, y0, _, y1 = chart.plot
    xs = _centres(chart, len(points))
    for (cls, _, _), vs in zip(series, values, strict=True):
        xy = [None if v is None else (x, y1 - (y1 - y0) * v / axis_top) for x, v in zip(xs, vs, strict=True)]
        chart.lines.append(_line(cls, xy))
    latest = [
        (lbl, next((v for v in reversed(vs) if v is not None), None))
        for (_, lbl, _), vs in zip(series, values, strict=True)
    ]
    chart.description = "; ".join(f"latest {k}: {'none' if v is None else label(v)}" for k, v in latest)
    return chart


PERCENTILES = (("p50", "p50"), ("p95", "p95"), ("p99", "p99"))


def duration_chart(chart_id: str, title: str, points: Sequence[ThroughputPoint]) -> Chart:
    """The p50, p95 and p99 handler durations per step, on a log axis (one tick per decade)."""
    chart = Chart(chart_id, title, "", list(PERCENTILES))
    values = [[getattr(p, f"{name}_seconds") for p in points] for name, _ in PERCENTILES]
    present = [v for vs in values for v in vs if v is not None and v > 0]
    chart.empty = not present
    low = math.floor(math.log10(min(present, default=0.001)) - 0.1)  # a value on a decade sits above the axis
    high = max(math.ceil(math.log10(max(present, default=0.01))), low + 1)
    _, y0, _, y1 = chart.plot

    def y_of(v: float) -> float:
        return y1 - (y1 - y0) * (math.log10(v) - low) / (high - low)

    chart.y_ticks = [(y_of(10.0**d), _duration_label(10.0**d)) for d in range(low, high + 1)]
    chart.x_ticks = _x_ticks(chart, points)
    xs = _centres(chart, len(points))
    for (cls, _), vs in zip(PERCENTILES, values, strict=True):
        chart.lines.append(
            _line(cls, [None if v is None else (x, y_of(v)) for x, v in zip(xs, vs, strict=True)])
        )
    worst = max((v for v in values[2] if v is not None), default=None)
    chart.description = "highest p99: " + ("none" if worst is None else _duration_label(worst))
    return chart


def duration_text(value: float | None) -> str:
    """A duration for the handler table: milliseconds below a second, else as elsewhere."""
    return "—" if value is None else _duration_label(value)


def _duration_label(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s" if value < 60 else seconds(value)


def sparkline(points: Sequence[ThroughputPoint], width: int = 160, height: int = 28) -> Line:
    """Runs per step as one small line (the per-handler table's), but the step still being counted."""
    values = [p.completed + p.failed + p.dead for p in points[:-1]]
    top = max(values, default=0) or 1
    step = width / max(len(values) - 1, 1)
    xy = [(i * step, height - 2 - (height - 4) * v / top) for i, v in enumerate(values)]
    return _line("completed", xy)


def routes(p: Pages) -> list[Route]:
    async def charts(request: Request) -> Response:
        q = request.query_params
        window = f.text_field(q, "window") or "1h"
        subscription = f.text_field(q, "subscription")
        data = await p.bus.throughput(subscription, window=window)
        names = await p.bus.subscription_names()
        return p.render(request, "charts.html", **page_values(p, data, window, subscription, names))

    return [Route("/charts", charts)]


def page_values(
    p: Pages, data: Throughput, window: str, subscription: str | None, names: list[str]
) -> dict[str, Any]:
    """What ``charts.html`` shows of one read of the rollup."""
    points = data.points
    query = {"subscription": subscription} if subscription else {}
    depth = [("depth", "pending", lambda x: x.depth)]
    lag = [("lag", "oldest due pending", lambda x: x.lag_seconds)]
    return {
        "data": data, "window": window, "windows": list(WINDOWS), "subscription": subscription,
        "names": names, "handler_names": {name: _handler_name(p, name) for name in data.subscriptions},
        "links": {w: urllib.parse.urlencode({**query, "window": w}) for w in WINDOWS},
        "step": _step(data),
        "throughput": bar_chart("runs", f"Handler runs per {_step(data)}", points),
        "durations": duration_chart("durations", "Handler duration (log scale)", points),
        "depth": line_chart("depth", "Queue depth", points, depth),
        "lag": line_chart("lag", "Lag", points, lag, label=_lag_label),
        "sparks": {name: sparkline(series) for name, series in data.subscriptions.items()},
        "duration": duration_text,
    }  # fmt: skip


def _lag_label(value: float) -> str:
    return f"{value:g}s" if value < 60 else seconds(value)


def _step(data: Throughput) -> str:
    return "minute" if data.step_seconds == 60 else f"{data.step_seconds // 60} minutes"


def _handler_name(p: Pages, name: str) -> str | None:
    sub = p.bus.subscriptions.get(name)
    handler = None if sub is None else sub.handler
    return None if handler is None else getattr(handler, "__qualname__", None)
