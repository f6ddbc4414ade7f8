"""Templates, filters and the small helpers every page shares."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import jinja2
import orjson
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..bus import Bus
from ..triage import DEFAULT_SAMPLE
from ._guard import Guard
from ._timeline import duration

__all__ = ["FLASHES", "STALE_WORKER_SECONDS", "Pages", "capped", "flash_message", "pretty_json"]

STALE_WORKER_SECONDS = 30.0
"""A worker silent this long (six missed heartbeats) is shown as gone, whatever its listener said."""

FLASHES = {
    "unlocked": "actions unlocked",
    "locked": "locked: unlock again to act",
    "replay": "replay: {n} dead letter(s)",
    "purge": "purge: {n} dead letter(s)",
    "cancelled": "cancelled {n} of {of} (pending ones only)",
    "subscription-pause": "subscription paused",
    "subscription-resume": "subscription resumed",
    "unchanged": "nothing to do",
    "approved": "approval {n}: approved",
    "denied": "approval {n}: denied",
    "decided": "approval {n}: decided",
    "instance-repoint": "repoint: version {n}",
    "instance-resolve": "resolve: version {n}",
    "instance-pause": "pause: version {n}",
    "instance-resume": "resume: version {n}",
    "instance-cancel": "cancel: version {n}",
    "schedule-pause": "schedule paused",
    "schedule-resume": "schedule resumed",
    "schedule-trigger": "schedule triggered: it fires at the next tick",
    "triage-cancel": "cancel: {n} failing deliveries",
    "stuck-retry": "retry now: {n} delivery(ies) due now",
    "stuck-release": "released: {n} delivery(ies)",
    "stuck-cancel": "cancelled: {n} delivery(ies)",
}
"""The messages an action may leave for the page it returns to, by code (``?flash=replay&n=3``)."""


def flash_message(query: Mapping[str, str]) -> str | None:
    """The message of a known flash code with its numbers; anything else shows nothing."""
    template = FLASHES.get(query.get("flash", ""))
    numbers = {k: query.get(k, "") for k in ("n", "of")}
    counted = {k: int(v) for k, v in numbers.items() if v.isdigit() and len(v) <= 19}
    if template is None or any(f"{{{k}}}" in template and k not in counted for k in numbers):
        return None
    return template.format(**counted)


def capped(n: int, cap: int) -> str:
    """``12,345`` or, past the cap, ``10,000+``."""
    return f"{cap:,}+" if n > cap else f"{n:,}"


def pretty_json(data: bytes) -> str:
    """Indented JSON when the bytes are JSON, else the text as it is (escaped by the template)."""
    try:
        return orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")


def when(value: datetime | None) -> Markup | str:
    """A ``<time>`` with the UTC time as text: the browser's script shows it in its own time zone."""
    if value is None:
        return "—"
    utc = value.astimezone(UTC)
    return Markup('<time datetime="{}">{}</time>').format(
        utc.strftime("%Y-%m-%dT%H:%M:%SZ"), utc.strftime("%Y-%m-%d %H:%M:%S")
    )


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
    env.filters["duration"] = lambda v: "—" if v is None else duration(v)
    return env


class Pages:
    """What the routes share: the bus, the guard, the templates and the options."""

    def __init__(
        self,
        bus: Bus,
        guard: Guard,
        *,
        title: str,
        trace_url: str | None,
        page_size: int,
        count_cap: int,
        triage_sample: int = DEFAULT_SAMPLE,
    ) -> None:
        self.bus = bus
        self.page_size = page_size
        self.count_cap = count_cap
        self.triage_sample = triage_sample
        self.guard = guard
        self.title = title
        self.trace_url = trace_url
        self.env = _environment()

    def render(self, request: Request, template: str, code: int = 200, **values: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        session = self.guard.session(request)
        page = self.env.get_template(template).render(
            base=base,
            title=self.title,
            read_only=self.guard.read_only,
            csrf=session.csrf if session else None,
            operator=session.operator if session else None,
            default_operator=self.guard.operator,
            flash=flash_message(request.query_params),
            path=request.url.path,
            **values,
        )
        return HTMLResponse(page, status_code=code)
