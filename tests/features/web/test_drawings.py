"""The machine page's drawn diagram and the instance page's run timeline, over both backends."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import httpx

from eventbus import Bus
from eventbus.web import create_app

from ..workflows._support import finish
from ._data import Charge, pay
from .conftest import ORIGIN

SVG = "{http://www.w3.org/2000/svg}"


def _svgs(html: str, cls: str) -> list[ET.Element]:
    found = re.findall(rf'<svg [^>]*class="{cls}".*?</svg>', html, re.S)
    return [ET.fromstring(s) for s in found]


async def test_machine_page_draws_the_table_with_runs_per_state(shared_ro: httpx.AsyncClient) -> None:
    page = await shared_ro.get("/machines/pay")
    assert page.status_code == 200
    (svg,) = _svgs(page.text, "machine-diagram")
    boxes = {"".join(g.itertext()) for g in svg.iter(f"{SVG}g") if "md-box" in (g.get("class") or "")}
    assert any(b.startswith("state CHARGE: 1 run(s) here (1 waiting_approval)") for b in boxes), boxes
    assert any("DONE" in b for b in boxes) and any("DENIED" in b for b in boxes)
    links = [a.get("href") for a in svg.iter(f"{SVG}a")]
    assert "/machines/pay?state=CHARGE" in links
    assert '<details class="diagram-source">' in page.text and "stateDiagram-v2" in page.text


async def test_instance_page_shows_the_run_timeline_and_where_it_is(
    seeded: Bus, ro: httpx.AsyncClient
) -> None:
    page = await ro.get("/machines/pay/instances/c-1")
    (drawing,) = _svgs(page.text, "machine-diagram")
    (current,) = [g for g in drawing.iter(f"{SVG}g") if "current" in (g.get("class") or "")]
    assert "CHARGE" in "".join(current.itertext())
    (timeline,) = _svgs(page.text, "run-timeline")
    assert "run started" in "".join(timeline.itertext())
    await seeded.workflows.approve((await seeded.workflows.approvals(pay, "c-1"))[0].id, by="alice")
    await finish(seeded, pay, ["c-1"])
    page = await ro.get("/machines/pay/instances/c-1")
    rows = re.findall(
        r"<tr><td class=\"num\">\d+</td>.*?</tr>",
        page.text.split('class="timeline-table"')[1].split("</table>")[0],
        re.S,
    )
    cells = [re.sub(r"<[^>]+>", "", r) for r in rows]
    assert len(cells) == 2
    assert "run started" in cells[0] and "approval-requested" in cells[0]
    assert "approved by alice" in cells[1] and "ok → DONE" in cells[1]
    (drawing,) = _svgs(page.text, "machine-diagram")
    (current,) = [g for g in drawing.iter(f"{SVG}g") if "current" in (g.get("class") or "")]
    assert "terminal (completed) DONE: 1 run(s) here" in "".join(current.itertext())


async def test_unknown_causes_read_as_unknown(seeded: Bus, ro: httpx.AsyncClient) -> None:
    """A row with no recorded cause (written before causes were recorded) says so."""
    backend = seeded.backend
    sql = "UPDATE {t} SET woken_by = NULL"
    if backend.kind == "postgres":
        async with backend.db.conn() as conn:  # type: ignore[attr-defined]
            await conn.execute(sql.format(t=f'"{backend.schema_name}".wf_history'))  # type: ignore[attr-defined]
    else:
        await backend.db.write(lambda c, q, now: c.execute(sql.format(t="wf_history")))  # type: ignore[attr-defined]
    page = await ro.get("/machines/pay/instances/c-1")
    assert '<td class="wake unknown">unknown</td>' in page.text


async def test_machine_pages_count_each_state_up_to_the_cap(seeded: Bus) -> None:
    """With count_cap, a (state, status) past it is counted no further: shown as ``N+`` on the
    machines list, the table, the drawn boxes and the diagram source; the rest stay exact."""
    for key in ("c-2", "c-3", "c-4"):
        await seeded.workflows.start(pay, Charge(key=key))  # pending in CHARGE: no worker runs them
    app = create_app(seeded, count_cap=2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN) as client:
        listed = (await client.get("/machines")).text
        page = await client.get("/machines/pay")
        instance = await client.get("/machines/pay/instances/c-1")
    row = re.search(r'href="/machines/pay">pay</a></td><td class="num">(.*?)</td>(.*?)</tr>', listed, re.S)
    assert row is not None and row.group(1) == "3+", listed
    assert "pending 2+</span>" in row.group(2) and "waiting_approval 1</span>" in row.group(2)
    cells = re.findall(r'\?status=(\w+)">.*?</a></td><td class="num">(.*?)</td>', page.text, re.S)
    assert sorted(cells) == [("pending", "2+"), ("waiting_approval", "1")], page.text
    for html in (page.text, instance.text):
        (svg,) = _svgs(html, "machine-diagram")
        boxes = {"".join(g.itertext()) for g in svg.iter(f"{SVG}g") if "md-box" in (g.get("class") or "")}
        runs = "state CHARGE: 3+ run(s) here (2+ pending, 1 waiting_approval)"
        assert any(b.startswith(runs) for b in boxes), boxes
        badges = ["".join(g.itertext()) for g in svg.iter(f"{SVG}g") if g.get("class") == "md-count"]
        assert badges == ["3+"], badges
    assert "CHARGE : [2+ pending, 1 waiting_approval]" in page.text
