"""The audit trail on the dashboard: what each action records, and the ``/audit`` page.

A cancel and a subscription's pause or resume record their row in their own
transaction (``audit=acting(request)``); other actions record theirs right
after the bus returned, with the count it returned. Both carry the operator
the guard let through and the client's address.
"""

from __future__ import annotations

import urllib.parse

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..audit import ACTIONS, Actor
from . import _filters as f
from ._guard import actor, client_of
from ._render import Pages

__all__ = ["acting", "audited", "routes"]


def acting(request: Request) -> Actor:
    """This request's operator and client address, for an action that records itself."""
    return Actor(actor(request), client_of(request), "dashboard")


async def audited(
    p: Pages, request: Request, action: str, target: str, count: int | None, filter: str | None = None
) -> None:
    """Record ``action`` on ``target`` by this request's operator from its client's address."""
    await p.bus.audit.record(
        action, target, actor=actor(request), origin=client_of(request), interface="dashboard",
        count=count, filter=filter,
    )  # fmt: skip


def routes(p: Pages) -> list[Route]:
    async def audit(request: Request) -> Response:
        q = request.query_params
        action, who = f.text_field(q, "action"), f.text_field(q, "actor")
        before = f.int_field(q, "before")
        rows = await p.bus.audit.entries(limit=p.page_size + 1, action=action, actor=who, before=before)
        query = {k: v for k, v in (("action", action), ("actor", who)) if v is not None}
        older = None
        if len(rows) > p.page_size:
            older = urllib.parse.urlencode({**query, "before": rows[p.page_size - 1].id})
        first = urllib.parse.urlencode(query) if before is not None else None
        return p.render(
            request, "audit.html", rows=rows[: p.page_size], query=query, actions=ACTIONS, more=older,
            first=first,
        )  # fmt: skip

    return [Route("/audit", audit)]
