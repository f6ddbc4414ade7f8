"""Who may act: read-only without a token; with one, same-origin POSTs from an unlocked session.

Unlocking with the token (and a name) opens a session: a cookie signed with
the token that carries the operator's name, and a per-session value the
forms post back (never the token itself). Scripts may instead send the token
in the ``X-Dashboard-Token`` header or a ``token`` form field. Every action is
logged under :data:`ACTION_LOG` with the operator and the client's address.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import logging
import secrets
import time
import urllib.parse
from typing import NamedTuple

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request

__all__ = ["ACTION_LOG", "COOKIE", "Guard", "Session", "actor", "log", "read_form"]

COOKIE = "eventbus_dashboard_session"
ACTION_LOG = "eventbus.web.actions"
"""The logger of every action (who, from where, what, with what result), at INFO."""
MAX_FORM_BYTES = 256 * 1024
MAX_OPERATOR_CHARS = 64
UNLOCK_TRIES = 5
"""Wrong tokens one client may give per :data:`UNLOCK_WINDOW_SECONDS` before unlocking is refused."""
UNLOCK_WINDOW_SECONDS = 60.0
_CLIENTS_KEPT = 10_000
log = logging.getLogger(ACTION_LOG)


class Refused(Exception):
    """An action the guard turned away; the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Session(NamedTuple):
    """An unlocked browser: who it is, and the value its forms carry."""

    operator: str
    csrf: str


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


def operator_name(given: object, default: str | None) -> str:
    """The name an operator unlocks with (``default`` when none is given), checked."""
    name = (given.strip() if isinstance(given, str) else "") or (default or "")
    if not name:
        raise Refused(400, "give your name to unlock: actions are recorded under it")
    if len(name) > MAX_OPERATOR_CHARS or not name.isprintable():
        raise Refused(400, f"a name is 1 to {MAX_OPERATOR_CHARS} printable characters")
    return name


class Guard:
    """``token=None`` makes the dashboard read-only: every action is refused.

    :param operator: the name actions are recorded under when none is given
        at unlock, and for scripts that send the token.
    """

    def __init__(self, token: str | None, operator: str | None = None) -> None:
        self.token = token or None
        self.operator = operator or None
        self._failures: collections.OrderedDict[str, list[float]] = collections.OrderedDict()

    @property
    def read_only(self) -> bool:
        return self.token is None

    def valid(self, given: str | None) -> bool:
        return self.token is not None and given is not None and hmac.compare_digest(given, self.token)

    def _mac(self, purpose: str, *parts: str) -> str:
        assert self.token is not None
        message = ":".join((purpose, *parts)).encode()
        return hmac.new(self.token.encode(), message, hashlib.sha256).hexdigest()

    def open_session(self, operator: str) -> str:
        """The cookie value of a new session for ``operator``, signed with the token."""
        nonce, name = secrets.token_urlsafe(16), _b64(operator)
        return f"{nonce}.{name}.{self._mac('session', nonce, name)}"

    def session(self, request: Request) -> Session | None:
        """The session of an unlocked browser (its cookie, if the token signed it), else None."""
        value = request.cookies.get(COOKIE, "")
        if self.token is None or value.count(".") != 2:
            return None
        nonce, name, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac("session", nonce, name)):
            return None
        try:
            operator = _unb64(name)
        except (binascii.Error, UnicodeDecodeError):
            return None
        return Session(operator, self._mac("csrf", nonce)[:32])

    def check(self, request: Request, form: FormData) -> str:
        """The operator acting, or :class:`Refused`: writable, same-origin, and a session or the token."""
        if self.read_only:
            raise Refused(403, "the dashboard is read-only: start it with a token to allow actions")
        if not same_origin(request):
            raise Refused(403, "cross-origin request refused")
        session = self.session(request)
        csrf = form.get("csrf")
        if session is not None and isinstance(csrf, str) and hmac.compare_digest(csrf, session.csrf):
            return session.operator
        given = form.get("token") or request.headers.get("x-dashboard-token")
        if self.valid(given if isinstance(given, str) else None):
            return self.operator or "dashboard"
        raise Refused(403, "unlock this browser with the token first (or the session has ended)")

    def throttle(self, request: Request) -> None:
        """Refuse an unlock from a client that gave :data:`UNLOCK_TRIES` wrong tokens within the window."""
        now = time.monotonic()
        recent = [t for t in self._failures.get(client_of(request), []) if now - t < UNLOCK_WINDOW_SECONDS]
        if len(recent) >= UNLOCK_TRIES:
            raise Refused(429, "too many wrong tokens: wait a minute before trying again")

    def failed(self, request: Request) -> None:
        """Count a wrong token against its client (the oldest clients are forgotten past a bound)."""
        client = client_of(request)
        self._failures.setdefault(client, []).append(time.monotonic())
        self._failures.move_to_end(client)
        self._failures[client] = self._failures[client][-UNLOCK_TRIES:]
        while len(self._failures) > _CLIENTS_KEPT:
            self._failures.popitem(last=False)


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


def client_of(request: Request) -> str:
    """The client's address: the peer, or what a configured trusted proxy forwarded."""
    return request.client.host if request.client else "?"


def actor(request: Request) -> str:
    """Who acted, for the log and the workflow audit trail: the operator the guard let through."""
    return str(request.state.operator)
