"""Triage by cause: dead letters and failing deliveries grouped by error, with actions on a whole group.

A group's actions, like the filter's, go through a confirmation page that
shows how many deliveries match in the database (not only in the sample the
grouping read); replay and purge walk the bus's dead-letter batches, cancel
walks the failing deliveries newest first a page at a time.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..bus import MAX_INSPECT_ROWS
from ..errors import ConfigurationError
from ..triage import error_groups, failing
from ..types import DeliveryFilter
from . import _filters as f
from ._actions import _back, _did
from ._audit import audited
from ._guard import read_form
from ._render import Pages, capped

__all__ = ["routes"]

KINDS = ("dead", "failing")
FIELDS = ("kind", "subscription", "event_type", "error_contains", "payload_contains")
OPS = {"dead": ("replay", "purge"), "failing": ("cancel",)}


def triage_filter(values: Mapping[str, Any]) -> tuple[str, DeliveryFilter]:
    """The kind (``dead`` or ``failing``) and the filter of a query string or form."""
    kind = f.text_field(values, "kind") or "dead"
    if kind not in KINDS:
        raise ConfigurationError(f"kind must be dead or failing, got {kind!r}")
    flt = DeliveryFilter(
        status="dead",
        subscription=f.text_field(values, "subscription"),
        event_type=f.text_field(values, "event_type"),
        error_contains=f.text_field(values, "error_contains"),
        payload_contains=f.text_field(values, "payload_contains"),
        message_pattern=f.text_field(values, "message_pattern"),
    )
    return kind, failing(flt) if kind == "failing" else flt


def routes(p: Pages) -> list[Route]:
    async def page(request: Request) -> Response:
        q = request.query_params
        kind, flt = triage_filter(q)
        found = await error_groups(p.bus, flt, sample=p.triage_sample)
        return p.render(
            request, "triage.html", kind=kind, triage=found, ops=OPS[kind], query=f.query_of(q, FIELDS),
            subscriptions=await p.bus.subscription_names(),
        )  # fmt: skip

    async def delivery(request: Request) -> Response:
        d = await p.bus.delivery(f.path_id(request.path_params["delivery_id"], "delivery"))
        return p.render(request, "traceback.html", d=d)

    async def endpoint(request: Request) -> Response:
        form = await read_form(request)
        request.state.operator = p.guard.check(request, form)
        return await _act(p, request, form)

    return [
        Route("/triage", page),
        Route("/triage/deliveries/{delivery_id}", delivery),
        Route("/triage/action", endpoint, methods=["POST"]),
    ]


async def _act(p: Pages, request: Request, form: FormData) -> Response:
    kind, flt = triage_filter(form)
    op = str(form.get("op") or "")
    if op not in OPS[kind]:
        raise ConfigurationError(f"op must be one of {', '.join(OPS[kind])} for {kind} deliveries")
    back = "/triage?" + urllib.parse.urlencode(f.query_of(form, FIELDS))
    if form.get("confirm") != "yes":
        count = await p.bus.count_deliveries(flt, cap=p.count_cap)
        hidden = [(k, str(v)) for k, v in form.multi_items() if k not in ("confirm", "token", "csrf")]
        return p.render(
            request, "confirm.html", op=op, count=count, shown=capped(count, p.count_cap),
            what=_describe(flt), hidden=hidden, back=back, action="/triage/action",
            noun="dead letter(s)" if kind == "dead" else "failing deliveries",
        )  # fmt: skip
    done = await _apply(p, op, flt)
    _did(request, f"triage {op} {kind} {_describe(flt)}", done)
    await audited(p, request, op, f"{kind} deliveries (triage)", done, _describe(flt))
    return _back(request, back, "triage-cancel" if op == "cancel" else op, n=done)


async def _apply(p: Pages, op: str, flt: DeliveryFilter) -> int:
    if op == "replay":
        return await p.bus.replay(flt)
    if op == "purge":
        return await p.bus.purge(flt)
    return await cancel_matching(p, flt)


async def cancel_matching(p: Pages, flt: DeliveryFilter) -> int:
    """Cancel every pending delivery matching ``flt``, a page at a time below a cursor."""
    total, before = 0, None
    while rows := await p.bus.find_deliveries(flt, limit=MAX_INSPECT_ROWS, before_id=before):
        total += await p.bus.cancel([r.id for r in rows])
        before = rows[-1].id
    return total


def _describe(flt: DeliveryFilter) -> str:
    fields = msgspec.structs.asdict(flt)
    parts = [f"{k}={v!r}" for k, v in fields.items() if v is not None and k != "status"]
    return "all matching " + (", ".join(parts) or "(everything)")
