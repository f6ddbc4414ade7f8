"""The state table drawn as SVG: every state and edge, no box over another, names escaped."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from itertools import combinations

import msgspec

from eventbus.types import WorkflowHistoryRow
from eventbus.web._timeline import duration, timeline_svg, visits
from eventbus.workflows import Approval, Machine, StepContext, Yield
from eventbus.workflows._diagram import _edges
from eventbus.workflows._drawing import draw, layout
from eventbus.workflows._machine import State
from eventbus.workflows._wake import describe_wake
from handlers.gallery import album
from handlers.retrain import machine as retrain

SVG = "{http://www.w3.org/2000/svg}"


class Ck(msgspec.Struct):
    key: str


def _loopy() -> Machine[Ck]:
    """Forward, skipping, back, self and same-column edges, an approval, a signal and a child."""
    m = Machine("loopy", checkpoint=Ck, key=lambda c: c.key)

    @m.state(initial=True, on_success="B", on_failure="DONE", children=album)
    async def A(c: Ck, ctx: StepContext) -> None: ...

    @m.state(on_success="C", on_failure="A", also=("B2",), continue_run=False, poll=5, wake_on="go <now>")
    async def B(c: Ck, ctx: StepContext) -> Yield | None: ...

    @m.state(on_success="C", on_failure="B", name="B2")
    async def b2(c: Ck, ctx: StepContext) -> None: ...

    @m.state(on_success="DONE", on_failure="C", max_visits=3,
             approval=Approval(timeout=timedelta(hours=1), on_deny="DENIED", on_timeout="B"))  # fmt: skip
    async def C(c: Ck, ctx: StepContext) -> None: ...

    m.terminal("DONE")
    m.terminal("DENIED", failed=True)
    return m


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def test_every_state_and_edge_is_drawn_and_no_two_boxes_overlap() -> None:
    for m in (_loopy(), retrain, album):
        d = layout(m)
        drawn = {b.name for b in d.boxes.values() if b.kind in ("state", "terminal")}
        table = _edges(m)
        assert set(m.states) <= drawn
        assert {t for _, t, _ in table} <= drawn, "every terminal a run can reach"
        pairs = {(d.boxes[e.source].name, d.boxes[e.target].name) for e in d.edges if e.source != "start"}
        assert {(s, t) for s, t, _ in table} <= pairs
        assert all(e.path.startswith("M") for e in d.edges)
        rects = [(b.x, b.y, b.w, b.h) for b in d.boxes.values()]
        for a, b in combinations(rects, 2):
            assert not _overlap(a, b), (m.name, a, b)
        vx, vy, vw, vh = d.view
        for x, y, w, h in rects + d.labels:
            assert vx <= x and x + w <= vx + vw and vy <= y and y + h <= vy + vh, "nothing is clipped"


def test_edge_kinds_of_a_table_with_loops() -> None:
    d = layout(_loopy())
    kinds = {(d.boxes[e.source].name, d.boxes[e.target].name): e.kind for e in d.edges if e.source != "start"}
    assert kinds[("A", "B")] == "forward"
    assert kinds[("B", "A")] == "back"
    assert kinds[("C", "C")] == "self"
    assert kinds[("A", "album")] == "child"
    assert d.boxes["s:DONE"].layer > d.boxes["s:C"].layer, "terminals come after the states leading into them"


def test_labels_are_distinct_where_they_can_be() -> None:
    d = layout(retrain)
    for a, b in combinations(d.labels, 2):
        assert a != b


def test_names_and_labels_are_escaped() -> None:
    m = _loopy()
    evil = '<b onclick="x">&"'
    m.states[evil] = State(name=evil, fn=m.states["A"].fn, on_success="DONE", on_failure="DONE",
                           wake_on=('sig<script>alert(1)</script>',), continue_run=False)  # fmt: skip
    svg = draw(m, counts={(evil, "waiting"): 2}, current=evil, link=lambda k, n: f"/x?s={n}")
    root = ET.fromstring(svg)  # well-formed: nothing a name holds became markup
    assert root.tag == f"{SVG}svg"
    assert not any(el.tag in (f"{SVG}script", "script", f"{SVG}b") for el in root.iter())
    texts = [el.text for el in root.iter(f"{SVG}text")]
    assert evil in texts and "wakes on" in " ".join(t or "" for t in texts)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    hrefs = [el.get("href") for el in root.iter(f"{SVG}a")]
    assert f"/x?s={evil}" in hrefs, "an attribute is escaped and reads back as given"


def test_counts_and_the_current_state() -> None:
    counts = {("POLL_JOB", "waiting"): 5, ("POLL_JOB", "running"): 2, ("DONE", "completed"): 9}
    svg = draw(retrain, counts=counts, current="POLL_JOB")
    root = ET.fromstring(svg)
    groups = {g.get("class"): g for g in root.iter(f"{SVG}g") if "md-box" in (g.get("class") or "")}
    (poll,) = [g for cls, g in groups.items() if "current" in (cls or "")]
    assert "POLL_JOB" in "".join(poll.itertext())
    badge = [t.text for t in poll.iter(f"{SVG}text")]
    assert "7" in badge, "every status together"
    title = poll.find(f"{SVG}title")
    assert title is not None and "5 waiting" in (title.text or "") and "2 running" in (title.text or "")
    assert len(re.findall(r'class="md-box[^"]*current', svg)) == 1


def _row(
    version: int, state: str, started: float, ended: float, woken_by: str | None, **kw: object
) -> WorkflowHistoryRow:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    fields: dict[str, object] = {
        "run_id": 1, "version": version, "state": state, "visit": 1, "outcome": "ok", "next_state": "X",
        "yielded": False, "error_code": None, "error": None, "actor": "worker:h:1", "reason": None,
        "delivery_id": None, "started_at": t0 + timedelta(seconds=started),
        "at": t0 + timedelta(seconds=ended), "woken_by": woken_by,
    }  # fmt: skip
    fields.update(kw)
    return WorkflowHistoryRow(**fields)  # type: ignore[arg-type]


def test_a_runs_visits_with_waits_and_causes() -> None:
    rows = [
        _row(2, "POLL", 0.0, 0.004, "start", outcome="yield"),
        _row(3, "POLL", 180.004, 180.01, "timer", outcome="yield"),
        _row(4, "POLL", 200.0, 200.5, "signal:gpu<done>"),
        _row(5, "CHARGE", 3800.5, 3801.0, "approved:alice"),
        _row(6, "CHARGE", 3802.0, 3802.0, None, actor="operator:bob", outcome="repoint"),
        _row(7, "OLD", 3900.0, 3901.0, None),
        _row(9, "OTHER", 0.0, 1.0, "start", run_id=2),
    ]
    run = visits(rows, 1)
    assert [v.row.version for v in run] == [2, 3, 4, 5, 6, 7], "one run only"
    assert [v.wake.text for v in run] == [
        "run started", "poll timer", "signal: gpu<done>", "approved by alice", "bob", "unknown",
    ]  # fmt: skip
    assert run[0].waited_seconds is None and round(run[1].waited_seconds or 0, 3) == 180.0
    assert round(run[2].ran_seconds, 3) == 0.5
    svg = timeline_svg(run)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "signal: gpu<done>" in texts and "3 min" in texts and "approved by alice" in texts
    assert timeline_svg([]) == ""
    long = visits(
        [_row(v, "POLL", v * 10.0, v * 10.0 + 1, "timer", outcome="yield") for v in range(2, 102)], 1
    )
    drawn = ET.fromstring(timeline_svg(long))
    bars = [g for g in drawn.iter(f"{SVG}g") if (g.get("class") or "").startswith("tl-visit")]
    assert len(bars) == 40 and "… 60 earlier" in [t.text for t in drawn.iter(f"{SVG}text")]


def test_durations_and_unknown_causes() -> None:
    assert [duration(s) for s in (0.004, 2.5, 200, 18120, 187200)] == [
        "4 ms", "2.5 s", "3 min 20 s", "5 h 2 min", "2 d 4 h",
    ]  # fmt: skip
    assert describe_wake(None).kind == "unknown"
    assert (
        describe_wake("children:thumbnail/a completed").text
        == "child machine finished: thumbnail/a completed"
    )
    assert describe_wake("retry:delivery attempt 2").text == "retry: delivery attempt 2"
    assert describe_wake("something-new").kind == "other"
