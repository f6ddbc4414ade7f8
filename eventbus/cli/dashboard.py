"""``eventbus dashboard``: serve the web dashboard (``pip install 'eventbus[web]'``)."""

from __future__ import annotations

import importlib.util

import click

from ..bus import Bus
from ._common import Obj, load_app, run

__all__ = ["dashboard"]

EXTRA_MISSING = "the dashboard needs the web extra: pip install 'eventbus[web]'"


def _extra_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("starlette", "jinja2", "uvicorn"))


def _target(obj: Obj, app: str | None) -> Bus:
    if app is None:
        return obj.bus()
    bus = load_app(app)
    obj.check_worker_target(bus, app)
    return bus


async def _preflight(bus: Bus) -> None:
    """Refuse a database that is unreachable or not migrated before serving anything."""
    probe = Bus(bus.dsn, schema=getattr(bus.backend, "schema_name", None))
    async with probe:
        await probe.status()


@click.command()
@click.argument("app", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8700, show_default=True, help="Port to listen on.")
@click.option(
    "--token",
    envvar="EVENTBUS_DASHBOARD_TOKEN",
    help="Allow actions (replay, purge, approve…) to whoever gives it; without it: read-only.",
)
@click.option("--trace-url", help="Link for an event's trace id, with {trace_id} in it.")
@click.pass_obj
def dashboard(
    obj: Obj, app: str | None, host: str, port: int, token: str | None, trace_url: str | None
) -> None:
    """Serve the dashboard of APP (module:bus, for its machines) or of --dsn on http://HOST:PORT."""
    if not _extra_installed():
        raise click.ClickException(EXTRA_MISSING)
    import uvicorn

    from ..web import create_app

    bus = _target(obj, app)
    run(lambda: _preflight(bus))
    mode = "actions need the token" if token else "read-only (no token)"
    click.echo(f"eventbus dashboard ({bus.backend.kind}) on http://{host}:{port}, {mode}", err=True)
    asgi = create_app(bus, token, trace_url=trace_url, close_bus=True)
    # Open event streams would hold a graceful shutdown for minutes: give them a second.
    uvicorn.run(asgi, host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)
