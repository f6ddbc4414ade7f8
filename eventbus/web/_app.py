"""The application factory and its routes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..bus import MAX_INSPECT_ROWS, Bus
from ..errors import ConfigurationError, EventBusError, NotFound
from ..triage import DEFAULT_SAMPLE, MAX_SAMPLE
from . import _actions, _audit, _charts, _live, _pages, _stuck, _triage
from ._guard import Guard, Refused
from ._render import Pages

__all__ = ["DEFAULT_PORT", "LOOPBACK_HOSTS", "create_app"]

DEFAULT_PORT = 8700
"""The port ``eventbus dashboard`` listens on unless ``--port`` says otherwise."""
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""The ``Host`` names accepted unless ``allowed_hosts`` says otherwise."""
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
     b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]  # fmt: skip
"""Sent with every response: no framing, no inline or foreign script, no sniffing, no referrer outside."""
Handler = Callable[[Request, Exception], Awaitable[HTMLResponse]]


def create_app(
    bus: Bus,
    token: str | None = None,
    *,
    title: str = "eventbus",
    trace_url: str | None = None,
    live_interval: float = 1.0,
    live_fallback: float = _live.DEFAULT_FALLBACK_SECONDS,
    page_size: int = 50,
    count_cap: int = 10_000,
    close_bus: bool = False,
    operator: str | None = None,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
    triage_sample: int = DEFAULT_SAMPLE,
) -> Starlette:
    """The dashboard of ``bus`` as an ASGI application.

    :param token: allows actions (replay, purge, approve, …): each is a
        same-origin POST carrying it. Without one the dashboard is read-only.
    :param trace_url: a link template for an event's trace id, e.g.
        ``https://traces.example/trace/{trace_id}``.
    :param live_interval: a page's panels refresh at most once in this many seconds.
    :param live_fallback: seconds without a change hint from the bus (a
        NOTIFY on PostgreSQL, a commit to the file on SQLite) after which the
        status is compared anyway, once for every open page: what sends no
        hint (a completion, a worker going silent) shows within it.
    :param page_size: rows per page of the lists (at most 999: a page reads one row more).
    :param count_cap: counts stop there and show as ``10,000+``, so pages stay fast on big tables.
    :param close_bus: close ``bus`` when the application shuts down.
    :param operator: the name actions are recorded under when the operator
        gives none at unlock (and for scripts sending the token).
    :param allowed_hosts: the ``Host`` names requests may carry (others get
        400), so a page of another site cannot reach the dashboard by DNS
        rebinding; ``*.example.com`` matches subdomains, ``["*"]`` any host
        (when the service it is mounted in checks hosts itself).
    :param triage_sample: the newest matching deliveries the triage page
        groups at most; past it, its counts are shown as lower bounds.
    """
    if not (live_interval > 0 and live_fallback > 0):
        given = f"{live_interval}, {live_fallback}"
        raise ConfigurationError(f"live_interval and live_fallback must be positive, got {given}")
    if not 1 <= triage_sample <= MAX_SAMPLE:
        raise ConfigurationError(f"triage_sample must be 1 to {MAX_SAMPLE}, got {triage_sample}")
    if not 1 <= page_size < MAX_INSPECT_ROWS or count_cap < 1:
        raise ConfigurationError(f"page_size must be 1 to {MAX_INSPECT_ROWS - 1} and count_cap at least 1")
    pages = Pages(
        bus,
        Guard(token, operator),
        title=title,
        trace_url=trace_url,
        page_size=page_size,
        count_cap=count_cap,
        triage_sample=triage_sample,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close_bus:
                await bus.aclose()

    routes = [
        *_pages.routes(pages),
        *_stuck.routes(pages),
        *_actions.routes(pages),
        *_triage.routes(pages),
        *_audit.routes(pages),
        *_charts.routes(pages),
        Route("/live", _live.endpoint(_live.Fanout(bus, live_fallback, count_cap), live_interval)),
        Mount("/static", StaticFiles(packages=[("eventbus.web", "static")]), name="static"),
    ]
    handlers: dict[type[Exception], Handler] = {
        Refused: _refused(pages),
        NotFound: _not_found(pages),
        EventBusError: _failed(pages),
    }
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts), www_redirect=False),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers, middleware=middleware)


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every HTTP response (a pure ASGI middleware: streams pass through)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _refused(pages: Pages) -> Handler:
    async def handle(request: Request, exc: Exception) -> HTMLResponse:
        assert isinstance(exc, Refused)
        return pages.render(request, "error.html", exc.status, message=exc.message)

    return handle


def _not_found(pages: Pages) -> Handler:
    async def handle(request: Request, exc: Exception) -> HTMLResponse:
        return pages.render(request, "error.html", 404, message=str(exc))

    return handle


def _failed(pages: Pages) -> Handler:
    async def handle(request: Request, exc: Exception) -> HTMLResponse:
        message = exc.message if isinstance(exc, EventBusError) else str(exc)
        return pages.render(request, "error.html", 400, message=f"{type(exc).__name__}: {message}")

    return handle
