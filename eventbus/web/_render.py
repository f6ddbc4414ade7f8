"""Templates, filters and the small helpers every page shares."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jinja2
import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..bus import Bus
from ._guard import Guard

__all__ = ["Pages", "capped", "pretty_json"]


def capped(n: int, cap: int) -> str:
    """``12,345`` or, past the cap, ``10,000+``."""
    return f"{cap:,}+" if n > cap else f"{n:,}"


def pretty_json(data: bytes) -> str:
    """Indented JSON when the bytes are JSON, else the text as it is (escaped by the template)."""
    try:
        return orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("eventbus.web", "templates"),
        autoescape=True,  # every value, payloads included, is escaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, seconds=seconds, number=lambda n: f"{n:,}")
    return env


class Pages:
    """What the routes share: the bus, the guard, the templates and the options."""

    def __init__(
        self, bus: Bus, guard: Guard, *, title: str, trace_url: str | None, page_size: int, count_cap: int
    ) -> None:
        self.bus = bus
        self.page_size = page_size
        self.count_cap = count_cap
        self.guard = guard
        self.title = title
        self.trace_url = trace_url
        self.env = _environment()

    def render(self, request: Request, template: str, code: int = 200, **values: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        page = self.env.get_template(template).render(
            base=base,
            title=self.title,
            read_only=self.guard.read_only,
            token=self.guard.session_token(request),
            flash=request.query_params.get("flash"),
            path=request.url.path,
            **values,
        )
        return HTMLResponse(page, status_code=code)
