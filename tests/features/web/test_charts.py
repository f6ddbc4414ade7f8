"""The ``/charts`` page: the rollup drawn as inline SVG, the window switch, the filter (both backends).

The seeded bus's drain ran real deliveries (three of ``charge`` failed twice
and went dead) and flushed its rollup when it stopped.
"""

from __future__ import annotations

import re

import httpx

from eventbus import Bus


def _handler_row(page: str, name: str) -> list[str]:
    """The numbers of one subscription's row of the handler table."""
    row = re.search(rf'<tr>\s*<td><a href="[^"]*">{re.escape(name)}</a></td>(.*?)</tr>', page, re.S)
    assert row is not None, page
    return re.findall(r'<td class="num">(?:<a [^>]*>)?([^<]*)', row.group(1))


async def test_charts_draw_the_rollup_of_the_last_hour(shared_ro: httpx.AsyncClient, shared_bus: Bus) -> None:
    r = await shared_ro.get("/charts")
    assert r.status_code == 200
    page = r.text
    for title in ("Handler runs per minute", "Handler duration (log scale)", "Queue depth", "Lag"):
        assert re.search(rf'<title id="chart-[a-z]+-title">{re.escape(title)}</title>', page), title
    assert page.count('<svg viewBox="0 0 720 210" role="img"') == 4
    assert '<span class="swatch s-dead"></span>dead-lettered' in page
    assert len(re.findall(r'<rect class="s-completed"', page)) >= 1
    columns = re.findall(r"<title>\d\d:\d\d UTC: (\d+) completed, (\d+) failed, (\d+) dead</title>", page)
    assert [sum(int(c[i]) for c in columns) for i in (1, 2)] == [3, 3]  # what a pointer over the bars reads
    # charge: 3 completed, 3 failed attempts to retry, 3 dead; p50, p95 and p99 shown.
    completed, failed, dead, *percentiles = _handler_row(page, "charge")
    assert (completed, failed, dead) == ("3", "3", "3")
    assert len(percentiles) == 3 and all(p.endswith(" ms") for p in percentiles)
    assert _handler_row(page, "ship")[:3] == ["3", "0", "0"]
    hour = await shared_bus.throughput(window="1h")
    assert {h.subscription for h in hour.handlers} <= set(
        re.findall(r'<td><a href="[^"]*">([^<]+)</a></td>', page)
    )


async def test_the_window_and_the_subscription_filter(shared_ro: httpx.AsyncClient) -> None:
    page = (await shared_ro.get("/charts?window=1d&subscription=charge")).text
    assert "Handler runs per 10 minutes" in page and "charge · last day" in page
    assert '<option value="1d" selected>' in page and "<option selected>charge</option>" in page
    assert re.findall(r'<td><a href="[^"]*">([^<]+)</a></td>', page) == ["charge"]
    assert 'href="/charts?subscription=charge&amp;window=1h"' in page  # the switch keeps the filter
    empty = (await shared_ro.get("/charts?subscription=%3Cb%3Enosuch")).text
    assert "&lt;b&gt;nosuch · last hour" in empty and "<b>nosuch" not in empty
    assert "No handler ran in this window" in empty and empty.count("no data in this window") == 4


async def test_an_unknown_window_is_refused_with_the_reason(shared_ro: httpx.AsyncClient) -> None:
    r = await shared_ro.get("/charts?window=2h")
    assert r.status_code == 400
    assert "window must be one of 1h, 1d, got &#39;2h&#39;" in r.text
