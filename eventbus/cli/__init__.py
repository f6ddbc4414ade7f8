"""Command line: ``eventbus migrate | worker | publish | cancel | status | subscriptions | dlq | bench``,
``eventbus schedule``, ``eventbus workflow``, ``eventbus dashboard`` and the pull claims
``eventbus claim | complete | fail | release | extend``.

The database comes from ``--dsn`` or ``$EVENTBUS_DSN`` and defaults to the
embedded SQLite file. User mistakes print one line and exit non-zero.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import anyio
import anyio.abc
import click
import msgspec
import orjson

from .. import logs
from ..event import event_version_of
from ..types import StatusReport
from ..worker import Worker, serve_health
from ._common import ID, Obj, enc_hook, load_app, run
from .audit import acting, audit
from .bench import bench
from .dashboard import dashboard
from .dlq import dlq
from .observe import metrics_options, print_status, prune, start_metrics, trace
from .pull import COMMANDS as PULL_COMMANDS
from .schedule import schedule
from .stuck import stuck
from .subscriptions import subscriptions, unserved_note
from .workflow import workflow

__all__ = ["main"]

_HARD_STOP_SECONDS = 1.0
"""How long the worker command may take to exit after a second signal."""


@click.group()
@click.option("--dsn", envvar="EVENTBUS_DSN", help="postgresql://… or sqlite:///path")
@click.option("--schema", envvar="EVENTBUS_SCHEMA", help="PostgreSQL schema (default eventbus)")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.option(
    "--log-format",
    type=click.Choice(["json", "text"]),
    help="Log lines as JSON objects or text (default: JSON unless stderr is a terminal).",
)
@click.pass_context
def cli(
    ctx: click.Context, dsn: str | None, schema: str | None, verbose: int, log_format: logs.LogFormat | None
) -> None:
    """eventbus: a durable, typed event bus."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logs.configure(level, log_format)
    given = ctx.get_parameter_source("schema") == click.core.ParameterSource.COMMANDLINE
    ctx.obj = Obj(dsn, schema, schema_on_command_line=given, verbose=verbose)


@cli.command()
@click.pass_obj
def migrate(obj: Obj) -> None:
    """Apply pending migrations."""

    async def go() -> list[str]:
        bus = obj.bus()
        try:
            return await bus.migrate()
        finally:
            await bus.aclose()

    applied = run(go)
    click.echo("applied: " + ", ".join(applied) if applied else "up to date")


@cli.command()
@click.argument("app")
@click.option("--concurrency", default=200, show_default=True, help="Handlers running at once.")
@click.option("--batch-size", default=100, show_default=True, help="Deliveries per claim.")
@click.option("--burst", is_flag=True, help="Exit when nothing is runnable.")
@click.option("--poll-interval", default=5.0, show_default=True, help="Slow poll, seconds.")
@click.option("--grace", default=10.0, show_default=True, help="Shutdown grace, seconds.")
@click.option(
    "--recovery-interval", default=1.0, show_default=True, help="Seconds between sweeps for expired leases."
)
@click.option(
    "--rescue-after",
    type=float,
    default=15.0,
    show_default=True,
    help="Take back the work of a worker silent this long (seconds, at least 10; 0: never).",
)
@click.option("--subscription", "subscriptions", multiple=True, help="Serve only these.")
@click.option("--migrate/--no-migrate", "run_migrate", default=False, help="Migrate first.")
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    help="Answer GET /livez and /readyz on HEALTH-HOST:PORT (200 or 503, JSON).",
)
@click.option(
    "--health-host",
    default="127.0.0.1",
    show_default=True,
    help="Address of the health probes (0.0.0.0 for a probe from outside, as in Kubernetes).",
)
@metrics_options
@click.pass_obj
def worker(
    obj: Obj,
    app: str,
    concurrency: int,
    batch_size: int,
    burst: bool,
    poll_interval: float,
    grace: float,
    recovery_interval: float,
    rescue_after: float,
    subscriptions: tuple[str, ...],
    run_migrate: bool,
    health_port: int | None,
    health_host: str,
    metrics_port: int | None,
    collect_queues: bool,
) -> None:
    """Run the handlers of APP (module:bus) until SIGTERM/SIGINT."""

    async def go() -> int:
        bus = load_app(app)
        obj.check_worker_target(bus, app)
        bus.outcome_log.completed_level = logging.INFO if obj.verbose else logging.DEBUG
        if collect_queues and metrics_port is None:
            raise click.UsageError("--collect-queues needs --metrics-port")
        w = Worker(
            bus,
            concurrency=concurrency,
            batch_size=batch_size,
            burst=burst,
            poll_interval_seconds=poll_interval,
            grace_seconds=grace,
            recovery_interval_seconds=recovery_interval,
            rescue_after_seconds=rescue_after or None,
            subscriptions=subscriptions or None,
        )
        with anyio.CancelScope() as closing:  # a second signal bounds closing the bus too
            async with bus:
                if run_migrate:
                    await bus.migrate()
                names = subscriptions or tuple(bus.subscriptions)
                click.echo(
                    f"worker {w.id} ({bus.backend.kind}): {', '.join(names)}; "
                    f"concurrency {concurrency}, batch {batch_size}"
                    f"{', burst' if burst else ''}",
                    err=True,
                )
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_stop_on_signals, w, closing)
                    start_metrics(tg, bus, metrics_port, collect_queues)
                    await _start_health(tg, w, health_host, health_port)
                    await w.run()
                    tg.cancel_scope.cancel()
        return w.processed

    processed = run(go)
    click.echo(f"worker stopped: {processed} deliveries completed", err=True)


async def _start_health(tg: anyio.abc.TaskGroup, w: Worker, host: str, port: int | None) -> None:
    """Serve the worker's health probes, if asked; say where (a port of 0 picks a free one)."""
    if port is None:
        return
    try:
        bound = await tg.start(serve_health, w, host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot serve health probes on {host}:{port}: {exc.strerror}") from exc
    click.echo(f"health probes on http://{host}:{bound}/livez and /readyz", err=True)


async def _stop_on_signals(w: Worker, closing: anyio.CancelScope) -> None:
    """First SIGTERM/SIGINT: graceful stop. Second: stop now, within about a second.

    After the second signal the worker gives the database half a second for
    what is left to write, and closing the bus gets the rest of
    ``_HARD_STOP_SECONDS``: a database that does not answer cannot hold the exit
    (the leases of whatever stays unwritten cover it).
    """
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for _ in signals:
            count += 1
            w.stop(now=count > 1)
            if count > 1:
                closing.deadline = min(closing.deadline, anyio.current_time() + _HARD_STOP_SECONDS)


@cli.command()
@click.argument("event_type")
@click.argument("payload")
@click.option("--key", help="Idempotency key.")
@click.option("--delay", type=float, default=0.0, help="Seconds before delivery.")
@click.option("--app", help="module:bus whose event classes validate the payload.")
@click.option(
    "--event-version",
    type=click.IntRange(min=1),
    help="Version the payload is written in (default: the --app class's, else 1).",
)
@click.pass_obj
def publish(
    obj: Obj,
    event_type: str,
    payload: str,
    key: str | None,
    delay: float,
    app: str | None,
    event_version: int | None,
) -> None:
    """Publish EVENT_TYPE with a JSON object PAYLOAD."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="PAYLOAD") from exc
    if not isinstance(body, dict):
        raise click.BadParameter("must be a JSON object", param_hint="PAYLOAD")

    async def go() -> Any:
        app_bus = load_app(app) if app else None
        version = event_version
        if app_bus is not None:
            event = app_bus.validate_payload(event_type, orjson.dumps(body), event_version)
            version = version or event_version_of(type(event))
        async with obj.publisher_for(app_bus) if app_bus is not None else obj.bus() as bus:
            return await bus.publish_raw(
                event_type, orjson.dumps(body), key=key, delay=delay, event_version=version
            )

    result = run(go)
    click.echo(f"event {result.event_id}" + (" (duplicate key)" if result.duplicate else ""))


@cli.command()
@click.argument("ids", nargs=-1, type=ID, required=True)
@click.pass_obj
def cancel(obj: Obj, ids: tuple[int, ...]) -> None:
    """Cancel pending deliveries by ID; deliveries in any other state are left alone."""

    async def go() -> int:
        async with obj.bus() as bus:
            return await bus.cancel(ids, audit=acting())

    count = run(go)
    skipped = len(set(ids)) - count
    click.echo(f"cancelled: {count}" + (f" ({skipped} not pending, left alone)" if skipped else ""))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def status(obj: Obj, as_json: bool) -> None:
    """Counts by event type, subscription and status."""

    async def go() -> StatusReport:
        async with obj.bus() as bus:
            return await bus.status()

    report = run(go)
    if as_json:
        click.echo(msgspec.json.encode(report, enc_hook=enc_hook))
        return
    print_status(report)
    for s in report.subscriptions:
        note = unserved_note(s)
        if note:
            click.echo(note)


cli.add_command(dlq)
cli.add_command(subscriptions)
cli.add_command(bench)
cli.add_command(schedule)
cli.add_command(workflow)
cli.add_command(trace)
cli.add_command(prune)
cli.add_command(dashboard)
cli.add_command(audit)
cli.add_command(stuck)
for command in PULL_COMMANDS:
    cli.add_command(command)


def main() -> None:
    cli(prog_name="eventbus")
