"""The actions: each a same-origin POST with the token, logged with who and what.

Dead-letter replay and purge go through a confirmation page first, which
shows how many deliveries the action would touch.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..errors import ConfigurationError
from ..types import DeliveryFilter
from . import _filters as f
from ._guard import COOKIE, Refused, actor, log, read_form, same_origin
from ._render import Pages, capped

__all__ = ["routes"]

Action = Callable[[Request, FormData], Awaitable[Response]]
MAX_SELECTED = 1000


def routes(p: Pages) -> list[Route]:
    def guarded(action: Action) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            form = await read_form(request)
            p.guard.check(request, form)
            return await action(request, form)

        return endpoint

    return [
        Route("/unlock", unlock(p), methods=["POST"]),
        Route("/dead/action", guarded(dead_action(p)), methods=["POST"]),
        Route("/deliveries/cancel", guarded(cancel_action(p)), methods=["POST"]),
        Route("/subscriptions/{name}/{op}", guarded(subscription_action(p)), methods=["POST"]),
        Route("/approvals/{approval_id:int}/{op}", guarded(approval_action(p)), methods=["POST"]),
        Route("/machines/{name}/instances/{key:path}/{op}", guarded(instance_action(p)), methods=["POST"]),
        Route("/schedules/{name}/{op}", guarded(schedule_action(p)), methods=["POST"]),
    ]


def _back(request: Request, to: str, flash: str) -> RedirectResponse:
    base = request.scope.get("root_path", "").rstrip("/")
    sep = "&" if "?" in to else "?"
    return RedirectResponse(f"{base}{to}{sep}{urllib.parse.urlencode({'flash': flash})}", status_code=303)


def _did(request: Request, what: str, result: object) -> None:
    log.info(
        "%s (%s): %s -> %s", actor(request), request.client.host if request.client else "?", what, result
    )


def unlock(p: Pages) -> Callable[[Request], Awaitable[Response]]:
    """Remember a valid token in a same-site cookie, so this browser's forms carry it."""

    async def endpoint(request: Request) -> Response:
        form = await read_form(request)
        given = form.get("token")
        if p.guard.read_only or not same_origin(request) or not p.guard.valid(str(given or "")):
            raise Refused(403, "wrong token, or the dashboard is read-only")
        response = _back(request, "/", "actions unlocked")
        root = request.scope.get("root_path", "") or "/"
        response.set_cookie(COOKIE, str(given), httponly=True, samesite="strict", path=root)
        _did(request, "unlock", "ok")
        return response

    return endpoint


def _ticked(form: FormData, what: str) -> list[int]:
    """The delivery ids ticked in a form (1 to MAX_SELECTED of them)."""
    try:
        ids = sorted({int(str(i)) for i in form.getlist("ids")})
    except ValueError:
        raise ConfigurationError("ids must be delivery ids") from None
    if not ids or len(ids) > MAX_SELECTED:
        raise ConfigurationError(f"select between 1 and {MAX_SELECTED} {what}")
    return ids


def _selection(form: FormData) -> DeliveryFilter:
    """The ids ticked, or the filter itself for ``scope=filter`` (everything matching)."""
    if form.get("scope") == "filter":
        return f.dead_filter(form)
    return DeliveryFilter(status="dead", ids=_ticked(form, "dead letters, or act on the filter"))


def cancel_action(p: Pages) -> Action:
    """Cancel the ticked deliveries; the guarded statement leaves all but pending ones alone."""

    async def action(request: Request, form: FormData) -> Response:
        ids = _ticked(form, "pending deliveries")
        done = await p.bus.cancel(ids)
        _did(request, f"cancel deliveries {ids}", done)
        return _back(
            request, "/deliveries?status=pending", f"cancelled {done} of {len(ids)} (pending ones only)"
        )

    return action


def dead_action(p: Pages) -> Action:
    async def action(request: Request, form: FormData) -> Response:
        op = form.get("op")
        if op not in ("replay", "purge"):
            raise ConfigurationError("op must be replay or purge")
        flt = _selection(form)
        if form.get("confirm") != "yes":
            return await _confirm(p, request, form, str(op), flt)
        done = await (p.bus.replay(flt) if op == "replay" else p.bus.purge(flt))
        _did(request, f"dead letters {op} {_describe(flt)}", done)
        query = f.query_of(form, f.DEAD_FIELDS)
        to = "/dead" + ("?" + urllib.parse.urlencode(query) if query else "")
        return _back(request, to, f"{op}: {done} dead letter(s)")

    return action


async def _confirm(p: Pages, request: Request, form: FormData, op: str, flt: DeliveryFilter) -> Response:
    if flt.ids is not None:
        count = len(flt.ids)
        shown = f"{count:,}"
    else:
        count = await p.bus.count_deliveries(flt, cap=p.count_cap)
        shown = capped(count, p.count_cap)
    hidden = [(k, str(v)) for k, v in form.multi_items() if k not in ("confirm", "token")]
    return p.render(
        request, "confirm.html", op=op, shown=shown, count=count, what=_describe(flt), hidden=hidden
    )


def _describe(flt: DeliveryFilter) -> str:
    if flt.ids is not None:
        return "ids " + ", ".join(map(str, flt.ids[:20])) + (" …" if len(flt.ids) > 20 else "")
    parts = [f"{k}={v}" for k, v in (("subscription", flt.subscription), ("event_type", flt.event_type),
                                     ("since", flt.since)) if v is not None]  # fmt: skip
    return "all matching " + (", ".join(parts) or "(every dead letter)")


def subscription_action(p: Pages) -> Action:
    async def action(request: Request, form: FormData) -> Response:
        name, op = request.path_params["name"], request.path_params["op"]
        if op == "pause":
            done: object = await p.bus.pause_subscription(name)
        elif op == "resume":
            done = await p.bus.resume_subscription(name)
        else:
            raise ConfigurationError(f"unknown subscription action {op!r}")
        _did(request, f"subscription {name} {op}", done)
        return _back(request, "/", f"{op} {name}: {'done' if done else 'nothing to do'}")

    return action


def approval_action(p: Pages) -> Action:
    async def action(request: Request, form: FormData) -> Response:
        approval_id, op = request.path_params["approval_id"], request.path_params["op"]
        reason = str(form.get("reason") or "") or None
        if op not in ("approve", "deny"):
            raise ConfigurationError(f"unknown approval action {op!r}")
        decide = p.bus.workflows.approve if op == "approve" else p.bus.workflows.deny
        row = await decide(approval_id, by=actor(request), reason=reason)
        _did(request, f"approval {approval_id} {op} ({row.machine}/{row.key})", row.status)
        to = f"/machines/{row.machine}/instances/{urllib.parse.quote(row.key)}"
        return _back(request, to, f"approval {approval_id}: {row.status}")

    return action


def instance_action(p: Pages) -> Action:
    async def action(request: Request, form: FormData) -> Response:
        name, key, op = (request.path_params[k] for k in ("name", "key", "op"))
        by, reason = actor(request), str(form.get("reason") or "").strip()
        if op == "repoint":
            to = str(form.get("to") or "")
            if not reason:
                raise ConfigurationError("a repoint needs a reason (it is kept in the history)")
            expect = str(form.get("expect") or "") or None
            done = await p.bus.workflows.repoint(name, key, to=to, reason=reason, by=by, expect=expect)
        elif op == "resolve":
            outcome = str(form.get("outcome") or "")
            done = await p.bus.workflows.resolve(name, key, outcome=outcome, by=by, reason=reason or None)
        elif op in ("pause", "resume", "cancel"):
            operate = {
                "pause": p.bus.workflows.pause,
                "resume": p.bus.workflows.resume,
                "cancel": p.bus.workflows.cancel,
            }[op]
            done = await operate(name, key, by=by, reason=reason or None)
        else:
            raise ConfigurationError(f"unknown instance action {op!r}")
        _did(request, f"instance {name}/{key} {op} {dict(form.items()) | {'token': '…'}}", done)
        return _back(
            request, f"/machines/{name}/instances/{urllib.parse.quote(key)}", f"{op}: version {done}"
        )

    return action


def schedule_action(p: Pages) -> Action:
    async def action(request: Request, form: FormData) -> Response:
        name, op = request.path_params["name"], request.path_params["op"]
        if op == "pause":
            await p.bus.schedules.pause(name)
            done = "paused"
        elif op == "resume":
            await p.bus.schedules.resume(name)
            done = "resumed"
        elif op == "trigger":
            done = f"requested for {await p.bus.schedules.trigger(name):%Y-%m-%d %H:%M:%S}"
        else:
            raise ConfigurationError(f"unknown schedule action {op!r}")
        _did(request, f"schedule {name} {op}", done)
        return _back(request, f"/schedules/{urllib.parse.quote(name)}", f"{name}: {done}")

    return action
