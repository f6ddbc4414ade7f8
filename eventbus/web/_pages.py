"""The read-only pages."""

from __future__ import annotations

import urllib.parse
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..types import ChainEvent, DeliveryFilter, DeliveryRow, StatusReport, trace_id_of
from ..workflows import Instance, Machine, diagram
from ..workflows._drawing import draw
from . import _filters as f
from ._render import STALE_WORKER_SECONDS, Pages, capped, pretty_json
from ._stuck import timings
from ._timeline import Visit, timeline_svg, visits

__all__ = ["routes"]

CHAIN_LIMIT = 200
"""The events of a chain an event page shows at most."""
PAYLOAD_SHOWN_BYTES = 64 * 1024
"""An event page shows this much of a payload; the rest is a download away."""


def routes(p: Pages) -> list[Route]:
    async def overview(request: Request) -> Response:
        return p.render(request, "overview.html", **overview_values(await p.bus.status(window=p.count_cap)))

    async def deliveries(request: Request) -> Response:
        q = request.query_params
        page = await listing(
            p, f.delivery_filter(q), f.query_of(q, f.DELIVERY_FIELDS), f.int_field(q, "before")
        )
        return p.render(
            request, "deliveries.html", **page, statuses=f.STATUSES, subscriptions=await _names(p),
            conditions=f.CONDITIONS, timing=await timings(p, page["rows"]),
        )  # fmt: skip

    async def event(request: Request) -> Response:
        event_id = f.path_id(request.path_params["event_id"], "event")
        view = await p.bus.event(event_id)
        tree = flatten(await p.bus.trace(event_id, limit=CHAIN_LIMIT))
        shown = view.payload[:PAYLOAD_SHOWN_BYTES]
        return p.render(
            request, "event.html", event=view, headers=dict(view.headers), tree=tree,
            payload=pretty_json(shown) if shown == view.payload else shown.decode("utf-8", "replace"),
            payload_bytes=len(view.payload), payload_cut=len(shown) < len(view.payload),
            trace=_trace_link(p.trace_url, trace_id_of(dict(view.headers))),
        )  # fmt: skip

    async def payload(request: Request) -> Response:
        """The payload's bytes as stored, as a download (never rendered by the browser)."""
        event_id = f.path_id(request.path_params["event_id"], "event")
        view = await p.bus.event(event_id)
        disposition = f'attachment; filename="event-{event_id}-payload.json"'
        return Response(view.payload, media_type="application/octet-stream",
                        headers={"Content-Disposition": disposition})  # fmt: skip

    async def dead(request: Request) -> Response:
        q = request.query_params
        page = await listing(p, f.dead_filter(q), f.query_of(q, f.DEAD_FIELDS), f.int_field(q, "before"))
        return p.render(request, "dead.html", **page, subscriptions=await _names(p))

    return [
        Route("/", overview),
        Route("/deliveries", deliveries),
        Route("/events/{event_id}", event),
        Route("/events/{event_id}/payload", payload),
        Route("/dead", dead),
        *machine_routes(p),
        *schedule_routes(p),
    ]


def machine_routes(p: Pages) -> list[Route]:
    async def machines(request: Request) -> Response:
        rows = []
        for name in sorted(p.bus.workflows.machines):
            counts = await p.bus.workflows.counts(name, cap=p.count_cap)
            by_status: dict[str, list[int]] = {}
            for (_, s), n in counts.items():
                by_status.setdefault(s, []).append(n)
            shown = {s: _summed(ns, p.count_cap) for s, ns in by_status.items()}
            rows.append((name, shown, _summed(counts.values(), p.count_cap)))
        return p.render(request, "machines.html", machines=rows)

    async def machine(request: Request) -> Response:
        m = p.bus.workflows.machine(request.path_params["name"])
        q = request.query_params
        status, state = f.text_field(q, "status"), f.text_field(q, "state")
        cap = p.count_cap
        counts = await p.bus.workflows.counts(m, cap=cap)
        found = await p.bus.workflows.instances(m, status=status, state=state, limit=p.page_size)
        return p.render(
            request, "machine.html", machine=m, instances=found, status=status, state=state,
            counts=[(group, capped(n, cap)) for group, n in sorted(counts.items())],
            diagram=diagram(m, counts=counts, cap=cap),
            drawing=Markup(draw(m, counts, current=state, link=_links(request, m), cap=cap)),
        )  # fmt: skip

    async def instance(request: Request) -> Response:
        m = p.bus.workflows.machine(request.path_params["name"])
        key = request.path_params["key"]
        inst = await p.bus.workflows.instance(m, key)
        history = await p.bus.workflows.history(m, key)
        run = visits(history, inst.run_id)
        counts = await p.bus.workflows.counts(m, cap=p.count_cap)
        drawing = draw(m, counts, current=inst.state, link=_links(request, m), cap=p.count_cap)
        return p.render(
            request, "instance.html", machine=m, inst=inst,
            checkpoint=pretty_json(msgspec.json.encode(inst.checkpoint)),
            history=history, approvals=await p.bus.workflows.approvals(m, key),
            signals=await p.bus.workflows.signals(m, key), states=sorted([*m.states, *m.terminals]),
            run=run, timeline=Markup(timeline_svg(run, _present(inst, run))), drawing=Markup(drawing),
        )  # fmt: skip

    return [
        Route("/machines", machines),
        Route("/machines/{name}", machine),
        Route("/machines/{name}/instances/{key:path}", instance),
    ]


def _summed(counts: Iterable[int], cap: int) -> str:
    """The sum of counts read capped at ``cap``: ``12,345``, or ``20,000+`` when one was past it."""
    ns = list(counts)
    total = f"{sum(min(n, cap) for n in ns):,}"
    return total + "+" if any(n > cap for n in ns) else total


def _present(inst: Instance[Any], run: list[Visit]) -> tuple[str, float] | None:
    """A live run's present wait: its status and the seconds since its last row (by this process's clock)."""
    if inst.status in ("completed", "failed", "cancelled") or not run:
        return None
    return inst.status, max(0.0, (datetime.now(UTC) - run[-1].row.at).total_seconds())


def _links(request: Request, m: Machine[Any]) -> Any:
    """The links of a drawing's boxes: a state to the machine's instances in it, a child to its machine."""
    base = request.scope.get("root_path", "").rstrip("/")

    def link(kind: str, name: str) -> str:
        if kind == "machine":
            return f"{base}/machines/{urllib.parse.quote(name)}"
        return f"{base}/machines/{urllib.parse.quote(m.name)}?state={urllib.parse.quote(name)}"

    return link


def schedule_routes(p: Pages) -> list[Route]:
    async def schedules(request: Request) -> Response:
        return p.render(request, "schedules.html", schedules=await p.bus.schedules.list())

    async def schedule(request: Request) -> Response:
        name = request.path_params["name"]
        info = await p.bus.schedules.info(name)
        return p.render(
            request, "schedule.html", s=info, occurrences=await p.bus.schedules.occurrences(name, 20)
        )

    return [Route("/schedules", schedules), Route("/schedules/{name:path}", schedule)]


async def listing(p: Pages, flt: DeliveryFilter, query: dict[str, str], before: int | None) -> dict[str, Any]:
    """One page of a delivery list below the cursor ``before``, its count, and its older and newer links.

    One row more than a page is read, so "older" is offered only when there
    is one; "newer" leads to the page just above this one.
    """
    rows = await p.bus.find_deliveries(flt, limit=p.page_size + 1, before_id=before)
    older = _link(query, rows[p.page_size - 1].id) if len(rows) > p.page_size else None
    return {
        "rows": rows[: p.page_size], "query": query, "more": older,
        "newer": None if before is None else await _newer(p, flt, query, before),
        "count": capped(await p.bus.count_deliveries(flt, cap=p.count_cap), p.count_cap),
    }  # fmt: skip


async def _newer(p: Pages, flt: DeliveryFilter, query: dict[str, str], before: int) -> str | None:
    """The link to the page above the cursor ``before``: none if nothing is there, the first page if less."""
    above: list[DeliveryRow] = await p.bus.find_deliveries(flt, limit=p.page_size + 1, after_id=before - 1)
    if not above:
        return None
    if len(above) <= p.page_size:
        return _link(query, None)
    return _link(query, sorted(r.id for r in above)[p.page_size - 1] + 1)


def _link(query: dict[str, str], before: int | None) -> str:
    return urllib.parse.urlencode(query if before is None else {**query, "before": before})


def overview_values(report: StatusReport) -> dict[str, Any]:
    done: Counter[tuple[str, str]] = Counter()
    for row in report.rows:
        done[(row.subscription, row.status)] += row.count
    queues = {q.name: q for q in report.queues}
    gone = {w.id for w in report.workers if w.silent_seconds > STALE_WORKER_SECONDS}
    return {"report": report, "done": done, "queues": queues, "gone": gone}


def flatten(root: ChainEvent) -> list[tuple[int, ChainEvent]]:
    """The causation tree depth-first, each event with its depth below the root (an indented list)."""
    out: list[tuple[int, ChainEvent]] = []
    stack = [(0, root)]
    while stack:
        depth, e = stack.pop()
        out.append((depth, e))
        stack.extend((depth + 1, c) for c in reversed(e.children))
    return out


def _trace_link(template: str | None, trace: str | None) -> tuple[str, str | None] | None:
    """The event's trace id (see :func:`eventbus.types.trace_id_of`) with its link when configured."""
    if trace is None:
        return None
    return trace, template.replace("{trace_id}", urllib.parse.quote(trace)) if template else None


async def _names(p: Pages) -> list[str]:
    return await p.bus.subscription_names()
