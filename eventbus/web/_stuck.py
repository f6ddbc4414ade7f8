"""Stuck and retrying deliveries on the dashboard.

Each processing row shows when its lease ends (or how long ago it ran out)
and the worker holding it, flagged ``lost`` when that worker has been silent
past :data:`~eventbus.web._render.STALE_WORKER_SECONDS`; each pending row
waiting after a failure shows its next attempt. The single delivery page
(``/deliveries/{id}``) shows the same with its history, and offers the
actions that fit its state.

The actions (``POST /deliveries/action``, ``op`` = ``retry``, ``release`` or
``cancel``) act on the ids ticked, or with ``scope=filter`` on everything the
list's filter matches (its ``condition`` is required then). As the dead-letter
replay, they go through the confirmation page first, showing the count, and
are recorded in the audit trail (see :mod:`eventbus.stuck` for what each does).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NamedTuple

from markupsafe import Markup
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..errors import ConfigurationError
from ..stuck import describe
from ..types import DeliveryDetail, DeliveryFilter, DeliveryRow, WorkerRow
from . import _filters as f
from ._audit import acting
from ._guard import client_of, log, read_form
from ._render import STALE_WORKER_SECONDS, Pages, capped, when

__all__ = ["Timing", "routes", "timings", "workers_by_id"]

OPS = {"retry": "retry now", "release": "release", "cancel": "cancel"}
"""The actions by their form value, with what the confirmation calls them."""
MAX_SELECTED = 1000


class Timing(NamedTuple):
    """What a row is waiting for: its lease and worker, or its next attempt."""

    text: str
    worker: str | None = None
    """The worker holding it: its id's first eight characters and host/pid when known."""
    lost: bool = False
    """Its worker is silent past the threshold (or gone from the table)."""
    stuck: bool = False
    """Processing with its lease run out, or held by a lost worker: release and cancel apply."""
    waiting: bool = False
    """Pending with its run_at ahead: retry now applies."""


def relative(seconds: float) -> str:
    """``12 s``, ``3 min``, ``2 h``, ``4 d``: a duration as a person reads it."""
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def timing(d: DeliveryRow | DeliveryDetail, workers: dict[str, WorkerRow], now: datetime) -> Timing:
    if d.status == "processing":
        w = workers.get(d.worker_id or "")
        lost = w is None or w.silent_seconds > STALE_WORKER_SECONDS
        short = (d.worker_id or "?")[:8]
        worker = f"{short} {w.hostname}/{w.pid}" if w is not None else f"{short} (no longer reporting)"
        if d.lease_until is None:
            return Timing("", worker, lost, lost)
        left = (d.lease_until - now).total_seconds()
        text = f"lease ends in {relative(left)}" if left >= 0 else f"lease expired {relative(left)} ago"
        return Timing(text, worker, lost, stuck=lost or left < 0)
    if d.status == "pending" and d.run_at > now:
        wait = relative((d.run_at - now).total_seconds())
        if d.attempts > 0:
            of = f" of {d.max_attempts}" if d.max_attempts else ""
            text = Markup("next attempt at {} (in {}), attempt {}{}").format(
                when(d.run_at), wait, d.attempts + 1, of
            )
        else:
            text = Markup("due at {} (in {})").format(when(d.run_at), wait)
        return Timing(text, waiting=True)
    return Timing("")


async def workers_by_id(p: Pages, rows: Iterable[DeliveryRow | DeliveryDetail]) -> dict[str, WorkerRow]:
    """The workers table by id, read only when a row is processing."""
    if not any(r.status == "processing" for r in rows):
        return {}
    return {w.id: w for w in await p.bus.workers()}


async def timings(p: Pages, rows: list[DeliveryRow]) -> dict[int, Timing]:
    """Each row's :class:`Timing`, by delivery id."""
    workers, now = await workers_by_id(p, rows), datetime.now(UTC)
    return {r.id: timing(r, workers, now) for r in rows}


def stuck_filter(values: FormData, op: str) -> DeliveryFilter:
    """The list's filter for ``op`` on everything matching: the list it acts on is required.

    Release acts on the stuck list, retry now on the retrying list, cancel on
    either, so the count confirmed is what the action may move.
    """
    flt = f.delivery_filter(values)
    if flt.condition is None:
        raise ConfigurationError("an action on everything matching needs the stuck or retrying list")
    if (op, flt.condition) in (("release", "retrying"), ("retry", "stuck")):
        raise ConfigurationError("release acts on the stuck list, retry now on the retrying list")
    return flt


def _ticked(form: FormData) -> list[int]:
    try:
        ids = sorted({int(str(i)) for i in form.getlist("ids")})
    except ValueError:
        raise ConfigurationError("ids must be delivery ids") from None
    if not ids or len(ids) > MAX_SELECTED:
        raise ConfigurationError(f"select between 1 and {MAX_SELECTED} deliveries, or act on the filter")
    return ids


def _back(request: Request, form: FormData, ids: list[int] | None) -> str:
    """Where the action returns: the single delivery page it came from, or the list with its filter."""
    if form.get("back") == "delivery" and ids is not None and len(ids) == 1:
        return f"/deliveries/{ids[0]}"
    query = f.query_of(form, f.DELIVERY_FIELDS)
    return "/deliveries" + ("?" + urllib.parse.urlencode(query) if query else "")


def routes(p: Pages) -> list[Route]:
    async def delivery(request: Request) -> Response:
        d = await p.bus.delivery(f.path_id(request.path_params["delivery_id"], "delivery"))
        t = timing(d, await workers_by_id(p, [d]), datetime.now(UTC))
        return p.render(request, "delivery.html", d=d, t=t)

    async def action(request: Request) -> Response:
        form = await read_form(request)
        request.state.operator = p.guard.check(request, form)
        op = str(form.get("op") or "")
        if op not in OPS:
            raise ConfigurationError("op must be retry, release or cancel")
        by_filter = form.get("scope") == "filter"
        flt = stuck_filter(form, op) if by_filter else None
        ids = None if by_filter else _ticked(form)
        target = flt if flt is not None else ids
        assert target is not None
        what = describe(flt) if flt is not None else "ids " + ", ".join(map(str, (ids or [])[:20]))
        if form.get("confirm") != "yes":
            count = len(ids) if ids is not None else await p.bus.count_deliveries(flt, cap=p.count_cap)
            hidden = [(k, str(v)) for k, v in form.multi_items() if k not in ("confirm", "token", "csrf")]
            return p.render(
                request, "confirm.html", op=OPS[op], shown=capped(count, p.count_cap), count=count,
                what=what, hidden=hidden, back=_back(request, form, ids), noun="delivery(ies)",
                action="/deliveries/action",
            )  # fmt: skip
        who = acting(request)
        if op == "retry":
            done = await p.bus.retry_now(target, audit=who)
        elif op == "release":
            done = await p.bus.release_stuck(target, audit=who, lost_after_seconds=STALE_WORKER_SECONDS)
        else:
            done = await p.bus.cancel(target, audit=who, stuck=True, lost_after_seconds=STALE_WORKER_SECONDS)
        log.info(
            "dashboard action by %s (%s): %s %s -> %s", who.name, client_of(request), OPS[op], what, done,
            extra={"operator": who.name, "client": client_of(request)},
        )  # fmt: skip
        base = request.scope.get("root_path", "").rstrip("/")
        to = _back(request, form, ids)
        sep = "&" if "?" in to else "?"
        flash = urllib.parse.urlencode({"flash": f"stuck-{op}", "n": done})
        return RedirectResponse(f"{base}{to}{sep}{flash}", status_code=303)

    return [
        Route("/deliveries/action", action, methods=["POST"]),
        Route("/deliveries/{delivery_id}", delivery),
    ]
