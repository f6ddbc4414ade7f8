"""The application factory and its routes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..bus import Bus
from ..errors import ConfigurationError, EventBusError, NotFound
from . import _actions, _live, _pages
from ._guard import Guard, Refused
from ._render import Pages

__all__ = ["DEFAULT_PORT", "create_app"]

DEFAULT_PORT = 8700
"""The port ``eventbus dashboard`` listens on unless ``--port`` says otherwise."""
Handler = Callable[[Request, Exception], Awaitable[HTMLResponse]]


def create_app(
    bus: Bus,
    token: str | None = None,
    *,
    title: str = "eventbus",
    trace_url: str | None = None,
    live_interval: float = 1.0,
    page_size: int = 50,
    count_cap: int = 10_000,
    close_bus: bool = False,
) -> Starlette:
    """The dashboard of ``bus`` as an ASGI application.

    :param token: allows actions (replay, purge, approve, …): each is a
        same-origin POST carrying it. Without one the dashboard is read-only.
    :param trace_url: a link template for an event's trace id, e.g.
        ``https://traces.example/trace/{trace_id}``.
    :param live_interval: seconds between the looks at the status behind the live updates.
    :param page_size: rows per page of the lists (at most 1000).
    :param count_cap: counts stop there and show as ``10,000+``, so pages stay fast on big tables.
    :param close_bus: close ``bus`` when the application shuts down.
    """
    if live_interval <= 0:
        raise ConfigurationError(f"live_interval must be positive, got {live_interval}")
    if not 1 <= page_size <= 1000 or count_cap < 1:
        raise ConfigurationError("page_size must be 1 to 1000 and count_cap at least 1")
    pages = Pages(
        bus, Guard(token), title=title, trace_url=trace_url, page_size=page_size, count_cap=count_cap
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
        *_actions.routes(pages),
        Route("/live", _live.endpoint(pages, live_interval)),
        Mount("/static", StaticFiles(packages=[("eventbus.web", "static")]), name="static"),
    ]
    handlers: dict[type[Exception], Handler] = {
        Refused: _refused(pages),
        NotFound: _not_found(pages),
        EventBusError: _failed(pages),
    }
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)


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
