"""The actions: each a same-origin POST from an unlocked session, logged with who and what.

Dead-letter replay and purge go through a confirmation page first, which
shows how many deliveries the action would touch. Each action redirects back
with a flash code (``?flash=replay&n=3``): a page shows only the messages it
knows, never text from the address.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Mapping

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..errors import ConfigurationError
from ..types import DeliveryFilter
from . import _filters as f
from ._audit import acting, audited
from ._guard import COOKIE, Refused, actor, client_of, log, operator_name, read_form, same_origin
from ._render import Pages, capped

__all__ = ["routes"]

Action = Callable[[Request, FormData], Awaitable[Response]]
MAX_SELECTED = 1000


def routes(p: Pages) -> list[Route]:
    def guarded(action: Action) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            form = await read_form(request)
            request.state.operator = p.guard.check(request, form)
            return await action(request, form)

        return endpoint

    return [
        Route("/unlock", unlock(p), methods=["POST"]),
        Route("/lock", lock(p), methods=["POST"]),
        Route("/dead/action", guarded(dead_action(p)), methods=["POST"]),
        Route("/deliveries/cancel", guarded(cancel_action(p)), methods=["POST"]),
        # Names may hold "/": the action is the last segment.
        Route("/subscriptions/{name:path}/{op}", guarded(subscription_action(p)), methods=["POST"]),
        Route("/approvals/{approval_id}/{op}", guarded(approval_action(p)), methods=["POST"]),
        Route("/machines/{name}/instances/{key:path}/{op}", guarded(instance_action(p)), methods=["POST"]),
        Route("/schedules/{name:path}/{op}", guarded(schedule_action(p)), methods=["POST"]),
    ]


def _back(request: Request, to: str, flash: str, **numbers: int) -> RedirectResponse:
    """Back to ``to`` with the flash code ``flash`` (see ``_render.FLASHES``) and its numbers."""
    base = request.scope.get("root_path", "").rstrip("/")
    sep = "&" if "?" in to else "?"
    query = urllib.parse.urlencode({"flash": flash, **numbers})
    return RedirectResponse(f"{base}{to}{sep}{query}", status_code=303)


def _did(request: Request, what: str, result: object, operator: str | None = None) -> None:
    log.info(
        "dashboard action by %s (%s): %s -> %s",
        operator or actor(request), client_of(request), what, result,
        extra={"operator": operator or actor(request), "client": client_of(request)},
    )  # fmt: skip


def unlock(p: Pages) -> Callable[[Request], Awaitable[Response]]:
    """Open a session for a valid token and the operator's name (a signed, same-site cookie)."""

    async def endpoint(request: Request) -> Response:
        if p.guard.read_only:
            raise Refused(403, "the dashboard is read-only: there is nothing to unlock")
        if not same_origin(request):
            raise Refused(403, "cross-origin request refused")
        p.guard.throttle(request)
        form = await read_form(request)
        given = form.get("token")
        if not p.guard.valid(given if isinstance(given, str) else None):
            p.guard.failed(request)
            _did(request, "unlock", "wrong token", operator="?")
            raise Refused(403, "wrong token")
        operator = operator_name(form.get("operator"), p.guard.operator)
        response = _back(request, "/", "unlocked")
        value = p.guard.open_session(operator)
        response.set_cookie(COOKIE, value, path=_cookie_path(request), httponly=True, samesite="strict")
        _did(request, "unlock", "ok", operator=operator)
        return response

    return endpoint


def lock(p: Pages) -> Callable[[Request], Awaitable[Response]]:
    """End this browser's session: its forms no longer act until it unlocks again."""

    async def endpoint(request: Request) -> Response:
        if not same_origin(request):
            raise Refused(403, "cross-origin request refused")
        session = p.guard.session(request)
        response = _back(request, "/", "locked")
        response.delete_cookie(COOKIE, path=_cookie_path(request), httponly=True, samesite="strict")
        if session is not None:
            _did(request, "lock", "ok", operator=session.operator)
        return response

    return endpoint


def _cookie_path(request: Request) -> str:
    """The session cookie is sent to the dashboard's own paths only (those it is mounted under)."""
    return str(request.scope.get("root_path", "") or "/")


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
        done = await p.bus.cancel(ids, audit=acting(request))
        _did(request, f"cancel deliveries {ids}", done)
        return _back(request, "/deliveries?status=pending", "cancelled", n=done, of=len(ids))

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
        target, used = _audit_target(flt)
        await audited(p, request, str(op), target, done, used)
        return _back(request, _dead_page(form), str(op), n=done)

    return action


async def _confirm(p: Pages, request: Request, form: FormData, op: str, flt: DeliveryFilter) -> Response:
    if flt.ids is not None:
        count = len(flt.ids)
        shown = f"{count:,}"
    else:
        count = await p.bus.count_deliveries(flt, cap=p.count_cap)
        shown = capped(count, p.count_cap)
    hidden = [(k, str(v)) for k, v in form.multi_items() if k not in ("confirm", "token", "csrf")]
    return p.render(
        request, "confirm.html", op=op, shown=shown, count=count, what=_describe(flt), hidden=hidden,
        back=_dead_page(form),
    )  # fmt: skip


def _dead_page(form: FormData) -> str:
    """The dead-letter page with the filter of ``form``, to go back to."""
    query = f.query_of(form, f.DEAD_FIELDS)
    return "/dead" + ("?" + urllib.parse.urlencode(query) if query else "")


def _describe(flt: DeliveryFilter) -> str:
    if flt.ids is not None:
        return "ids " + ", ".join(map(str, flt.ids[:20])) + (" …" if len(flt.ids) > 20 else "")
    parts = [f"{k}={v}" for k, v in (("subscription", flt.subscription), ("event_type", flt.event_type),
                                     ("since", flt.since)) if v is not None]  # fmt: skip
    return "all matching " + (", ".join(parts) or "(every dead letter)")


def _audit_target(flt: DeliveryFilter) -> tuple[str, str | None]:
    """The audit trail's target and filter of a dead-letter action: the ids, or the filter used."""
    if flt.ids is not None:
        return _describe(flt), None
    return "dead letters", _describe(flt)


def _instance_details(fields: Mapping[str, object]) -> str | None:
    """What an instance action was given (target state, outcome, reason), for the audit trail."""
    shown = [f"{k}={v}" for k, v in fields.items() if k in ("to", "expect", "outcome", "reason") and v]
    return ", ".join(shown) or None


def subscription_action(p: Pages) -> Action:
    async def action(request: Request, form: FormData) -> Response:
        name, op = request.path_params["name"], request.path_params["op"]
        if op == "pause":
            done: object = await p.bus.pause_subscription(name, audit=acting(request))
        elif op == "resume":
            done = await p.bus.resume_subscription(name, audit=acting(request))
        else:
            raise ConfigurationError(f"unknown subscription action {op!r}")
        _did(request, f"subscription {name} {op}", done)
        return _back(request, "/", f"subscription-{op}" if done else "unchanged")

    return action


def approval_action(p: Pages) -> Action:
    async def action(request: Request, form: FormData) -> Response:
        approval_id, op = f.path_id(request.path_params["approval_id"], "approval"), request.path_params["op"]
        reason = str(form.get("reason") or "") or None
        if op not in ("approve", "deny"):
            raise ConfigurationError(f"unknown approval action {op!r}")
        decide = p.bus.workflows.approve if op == "approve" else p.bus.workflows.deny
        row = await decide(approval_id, by=actor(request), reason=reason)
        _did(request, f"approval {approval_id} {op} ({row.machine}/{row.key})", row.status)
        await audited(p, request, op, f"approval {approval_id} of {row.machine}/{row.key}", 1)
        to = f"/machines/{row.machine}/instances/{urllib.parse.quote(row.key)}"
        return _back(
            request, to, row.status if row.status in ("approved", "denied") else "decided", n=approval_id
        )

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
        fields = {k: v for k, v in form.items() if k not in ("token", "csrf")}
        _did(request, f"instance {name}/{key} {op} {fields}", done)
        await audited(p, request, op, f"instance {name}/{key}", 1, _instance_details(fields))
        return _back(
            request, f"/machines/{name}/instances/{urllib.parse.quote(key)}", f"instance-{op}", n=done
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
            done = f"requested for {await p.bus.schedules.trigger(name):%Y-%m-%d %H:%M:%S} UTC"
        else:
            raise ConfigurationError(f"unknown schedule action {op!r}")
        _did(request, f"schedule {name} {op}", done)
        await audited(p, request, op, f"schedule {name}", 1 if op == "trigger" else None)
        return _back(request, f"/schedules/{urllib.parse.quote(name)}", f"schedule-{op}")

    return action
