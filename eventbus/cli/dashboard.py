"""``eventbus dashboard``: serve the web dashboard (``pip install 'eventbus[web]'``)."""

from __future__ import annotations

import importlib.util
import ipaddress
import logging
import socket

import click

from ..bus import Bus
from ..errors import EventBusError
from ._common import Obj, load_app, run

__all__ = ["allowed_hosts_for", "dashboard"]

EXTRA_MISSING = "the dashboard needs the web extra: pip install 'eventbus[web]'"
LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "")


def _extra_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("starlette", "jinja2", "uvicorn"))


def _target(obj: Obj, app: str | None) -> Bus:
    """The bus to serve: APP's, or one on --dsn; a bad APP is one line, not a traceback."""
    try:
        if app is None:
            return obj.bus()
        bus = load_app(app)
        obj.check_worker_target(bus, app)
    except EventBusError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc.message}") from exc
    return bus


async def _preflight(bus: Bus) -> None:
    """Refuse a database that is unreachable or not migrated before serving anything."""
    probe = Bus(bus.dsn, schema=getattr(bus.backend, "schema_name", None))
    async with probe:
        await probe.status()


def _as_host_header(host: str) -> str:
    """How ``host`` appears in a Host header: IPv6 addresses in brackets."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def allowed_hosts_for(host: str, given: tuple[str, ...]) -> list[str]:
    """The Host names to accept: those given, else the bound address's own (this machine's on a wildcard)."""
    if given:
        return [h.strip() for item in given for h in item.split(",") if h.strip()]
    if host in WILDCARDS:
        return [*LOOPBACK, socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys([_as_host_header(host), *LOOPBACK]))


def _log_actions() -> None:
    """Every action is logged, whatever the command line's level: an operator's record of what was done."""
    actions = logging.getLogger("eventbus.web.actions")
    if actions.getEffectiveLevel() > logging.INFO:
        actions.setLevel(logging.INFO)


@click.command()
@click.argument("app", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8700, show_default=True, help="Port to listen on.")
@click.option(
    "--token",
    envvar="EVENTBUS_DASHBOARD_TOKEN",
    help="Allow actions (replay, purge, approve…) to whoever gives it; without it: read-only.",
)
@click.option(
    "--operator",
    envvar="EVENTBUS_DASHBOARD_OPERATOR",
    help="The name actions are recorded under when none is given at unlock.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="EVENTBUS_DASHBOARD_ALLOWED_HOSTS",
    help="A Host name to accept (repeat, or comma-separate); default: the --host address's own names.",
)
@click.option(
    "--forwarded-allow-ips",
    envvar="EVENTBUS_DASHBOARD_FORWARDED_ALLOW_IPS",
    help="Trust X-Forwarded-For/-Proto from these proxy addresses (comma-separated); default: from none.",
)
@click.option("--trace-url", help="Link for an event's trace id, with {trace_id} in it.")
@click.option(
    "--live-fallback",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds without a change hint from the database after which open pages compare the status anyway.",
)
@click.pass_obj
def dashboard(
    obj: Obj,
    app: str | None,
    host: str,
    port: int,
    token: str | None,
    operator: str | None,
    allowed_hosts: tuple[str, ...],
    forwarded_allow_ips: str | None,
    trace_url: str | None,
    live_fallback: float,
) -> None:
    """Serve the dashboard of APP (module:bus, for its machines) or of --dsn on http://HOST:PORT."""
    if not _extra_installed():
        raise click.ClickException(EXTRA_MISSING)
    import uvicorn

    from ..web import create_app

    bus = _target(obj, app)
    run(lambda: _preflight(bus))
    hosts = allowed_hosts_for(host, allowed_hosts)
    mode = "actions need the token" if token else "read-only (no token)"
    click.echo(
        f"eventbus dashboard ({bus.backend.kind}) on http://{_as_host_header(host)}:{port}, {mode}; "
        f"accepting Host {', '.join(hosts)}",
        err=True,
    )
    _log_actions()
    asgi = create_app(
        bus,
        token,
        trace_url=trace_url,
        close_bus=True,
        operator=operator,
        allowed_hosts=hosts,
        live_fallback=live_fallback,
    )
    # Open event streams would hold a graceful shutdown for minutes: give them a second.
    uvicorn.run(
        asgi,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=1,
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips,
    )
