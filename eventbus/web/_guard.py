"""Who may act: read-only without a token; with one, same-origin POSTs carrying it."""

from __future__ import annotations

import hmac
import logging
import urllib.parse

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request

__all__ = ["COOKIE", "Guard", "log", "read_form"]

COOKIE = "eventbus_dashboard_token"
MAX_FORM_BYTES = 256 * 1024
log = logging.getLogger("eventbus.web")


class Refused(Exception):
    """An action the guard turned away; the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Guard:
    """``token=None`` makes the dashboard read-only: every action is refused."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None

    @property
    def read_only(self) -> bool:
        return self.token is None

    def valid(self, given: str | None) -> bool:
        return self.token is not None and given is not None and hmac.compare_digest(given, self.token)

    def session_token(self, request: Request) -> str | None:
        """The token of an unlocked browser (its cookie), to render into the forms it posts."""
        given = request.cookies.get(COOKIE)
        return given if self.valid(given) else None

    def check(self, request: Request, form: FormData) -> None:
        """Refuse unless writable, same-origin, and the token is in the form or a header."""
        if self.read_only:
            raise Refused(403, "the dashboard is read-only: start it with a token to allow actions")
        if not same_origin(request):
            raise Refused(403, "cross-origin request refused")
        given = form.get("token") or request.headers.get("x-dashboard-token")
        if not self.valid(given if isinstance(given, str) else None):
            raise Refused(403, "missing or wrong dashboard token")


async def read_form(request: Request) -> FormData:
    """The URL-encoded form the dashboard's pages post (bounded; nothing else is accepted)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise Refused(415, "actions are posted as URL-encoded forms")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(413, "form too large")
    pairs: list[tuple[str, str | UploadFile]] = []
    pairs.extend(urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    return FormData(pairs)


def same_origin(request: Request) -> bool:
    """The Origin (or, without one, the Referer) names this host; a request with neither is refused."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False
    parts = urllib.parse.urlsplit(source)
    host = request.headers.get("host", "")
    return parts.scheme in ("http", "https") and parts.netloc == host


def actor(request: Request) -> str:
    """Who acted, for the log and the workflow audit trail: the remote address."""
    client = request.client
    return f"dashboard@{client.host}" if client else "dashboard"
