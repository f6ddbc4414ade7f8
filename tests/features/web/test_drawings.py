"""The machine page's drawn diagram and the instance page's run timeline, over both backends."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import httpx

from eventbus import Bus

from ..workflows._support import finish
from ._data import pay

SVG = "{http://www.w3.org/2000/svg}"


def _svgs(html: str, cls: str) -> list[ET.Element]:
    found = re.findall(rf'<svg [^>]*class="{cls}".*?</svg>', html, re.S)
    return [ET.fromstring(s) for s in found]


async def test_machine_page_draws_the_table_with_runs_per_state(ro: httpx.AsyncClient) -> None:
    page = await ro.get("/machines/pay")
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
