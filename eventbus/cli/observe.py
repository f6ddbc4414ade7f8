"""``eventbus trace`` and ``eventbus prune``, and the text of ``eventbus status``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import click
import msgspec

from ..bus import Bus
from ..retention import PruneReport, Retention
from ..types import ChainEvent, EventTypeRow, StatusReport
from ._common import COUNT, ID, Obj, enc_hook, run

__all__ = ["metrics_options", "print_status", "prune", "start_metrics", "trace"]


def metrics_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--collect-queues",
        is_flag=True,
        help="Also export queue and storage gauges (run this in one process, not every worker).",
    )(f)
    f = click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        help="Serve Prometheus /metrics on 127.0.0.1:PORT (needs eventbus[metrics]).",
    )(f)
    return f


def start_metrics(tg: anyio.abc.TaskGroup, bus: Bus, port: int | None, collect_queues: bool) -> None:
    """Install the metrics hooks and serve them; with ``collect_queues``, refresh the queue gauges."""
    if port is None:
        return
    from ..metrics import Metrics, QueueCollector

    metrics = Metrics.install(bus)
    if collect_queues:
        tg.start_soon(QueueCollector(bus, registry=metrics.registry).run)
    try:
        metrics.serve(port)
    except OSError as exc:
        raise click.ClickException(f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror}") from exc


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _delivery_lines(event: ChainEvent) -> list[str]:
    lines = []
    for d in event.deliveries:
        took = f" in {_age(d.elapsed_seconds)}" if d.elapsed_seconds is not None else ""
        error = f" last error: {d.last_error}" if d.last_error and d.status != "completed" else ""
        replays = f", {d.replays} replays" if d.replays else ""
        attempts = f"{d.attempts} attempt{'' if d.attempts == 1 else 's'}"
        lines.append(f"{d.subscription}: {d.status} (delivery {d.id}, {attempts}{replays}){took}{error}")
    return lines or ["no subscription handles this event type"]


def chain_lines(root: ChainEvent) -> list[str]:
    """The tree as indented lines, children under their cause."""
    out: list[str] = []
    stack: list[tuple[ChainEvent, str, bool]] = [(root, "", True)]
    while stack:
        event, prefix, last = stack.pop()
        branch = "" if event is root else ("└─ " if last else "├─ ")
        key = f" key={event.key}" if event.key else ""
        trace_id = f" trace={event.trace_id}" if event.trace_id else ""
        out.append(f"{prefix}{branch}event {event.id} {event.event_type}{key}{trace_id}")
        inner = prefix + ("" if event is root else ("   " if last else "│  "))
        for line in _delivery_lines(event):
            out.append(f"{inner}  · {line}")
        kids = list(event.children)
        for i, child in reversed(list(enumerate(kids))):
            stack.append((child, inner, i == len(kids) - 1))
    return out


@click.command()
@click.argument("event_id", type=ID)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--limit", default=1000, show_default=True, type=COUNT, help="Most events.")
@click.pass_obj
def trace(obj: Obj, event_id: int, as_json: bool, limit: int) -> None:
    """The causation tree of EVENT_ID's chain: each event and each delivery's outcome."""

    async def go() -> ChainEvent:
        async with obj.bus() as bus:
            return await bus.trace(event_id, limit=limit)

    root = run(go)
    if as_json:
        click.echo(msgspec.json.encode(root, enc_hook=enc_hook))
        return
    for line in chain_lines(root):
        click.echo(line)


def _summary(report: PruneReport) -> str:
    verb = "would delete" if report.dry_run else "deleted"
    # On PostgreSQL events go a chunk of the log at a time.
    chunks = f" in {report.event_chunks} chunks of the log" if report.event_chunks else ""
    return (
        f"{verb}: {report.completed_deliveries} completed, {report.dead_deliveries} dead deliveries, "
        f"{report.events} events{chunks}, {report.occurrences} schedule occurrences, {report.workflows} "
        f"finished workflows ({report.workflow_rows} rows), {report.audit_rows} audit rows, "
        f"{report.rollup_rows} throughput rollup rows ({report.batches} batches)"
    )


@click.command()
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@click.option("--completed-retention", type=float, help="Days to keep completed deliveries (default 7).")
@click.option("--dead-retention", type=float, help="Days to keep dead deliveries (default 30).")
@click.option("--dedup-window", type=float, help="Days a keyed event is kept at least (default 7).")
@click.option("--occurrence-retention", type=float, help="Days to keep schedule occurrences (default 7).")
@click.option("--workflow-retention", type=float, help="Days to keep finished workflows (default 30).")
@click.option("--audit-retention", type=float, help="Days to keep the audit trail (default 90).")
@click.option("--rollup-retention", type=float, help="Days to keep the throughput rollup (default 2).")
@click.pass_obj
def prune(
    obj: Obj,
    dry_run: bool,
    completed_retention: float | None,
    dead_retention: float | None,
    dedup_window: float | None,
    occurrence_retention: float | None,
    workflow_retention: float | None,
    audit_retention: float | None,
    rollup_retention: float | None,
) -> None:
    """Delete finished deliveries, events, schedule occurrences and workflows past their retention."""
    for name, value in (
        ("--completed-retention", completed_retention),
        ("--dead-retention", dead_retention),
        ("--dedup-window", dedup_window),
        ("--occurrence-retention", occurrence_retention),
        ("--workflow-retention", workflow_retention),
        ("--audit-retention", audit_retention),
        ("--rollup-retention", rollup_retention),
    ):
        if value is not None and not 0 <= value < 1e6:
            raise click.BadParameter("must be a number of days, 0 or more", param_hint=name)
    default = Retention()

    def days(value: float | None, fallback: timedelta | None) -> timedelta | None:
        return fallback if value is None else timedelta(days=value)

    retention = Retention(
        completed_retention=days(completed_retention, default.completed_retention),
        dead_retention=days(dead_retention, default.dead_retention),
        dedup_window=days(dedup_window, default.dedup_window) or default.dedup_window,
        occurrence_retention=days(occurrence_retention, default.occurrence_retention),
        workflow_retention=days(workflow_retention, default.workflow_retention),
        audit_retention=days(audit_retention, default.audit_retention),
        rollup_retention=days(rollup_retention, default.rollup_retention),
    )
    tty = sys.stderr.isatty()

    def progress(report: PruneReport) -> None:
        if tty:
            click.echo("\r" + _summary(report), nl=False, err=True)

    async def go() -> PruneReport:
        async with obj.bus() as bus:
            return await bus.prune(dry_run=dry_run, retention=retention, progress=progress)

    report = run(go)
    if tty:
        click.echo("", err=True)
    if report.skipped:
        raise click.ClickException(f"prune skipped: {report.skipped}")
    click.echo(_summary(report))


def _versions(t: EventTypeRow) -> str:
    """``v1``, or each version with its count when there are several (``v1 12, v2 100000+``)."""
    if len(t.versions) < 2:
        return ", ".join(f"v{v}" for v in t.versions)
    cap = t.events if t.events_capped else None  # a version's count stops at the same cap
    return ", ".join(f"v{v} {n}{'+' if n == cap else ''}" for v, n in sorted(t.versions.items()))


def print_status(report: StatusReport) -> None:
    """The text form of ``eventbus status``."""
    click.echo(f"events: {report.events}")
    click.echo(f"oldest runnable pending: {_age(report.oldest_pending_seconds)}")
    if report.replica_lag_seconds is not None:
        click.echo(f"counts read from a replica, {report.replica_lag_seconds:.1f}s behind the primary")
    click.echo(f"{'EVENT TYPE':<32} {'EVENTS':>9} {'SUBSCRIPTIONS':>13}  VERSIONS")
    for t in report.event_types:
        count = f"{t.events}+" if t.events_capped else str(t.events)
        handled = str(t.subscriptions) if t.subscriptions else "0 (unhandled)"
        click.echo(f"{t.event_type:<32} {count:>9} {handled:>13}  {_versions(t)}")
    capped = any(s.completed_last_hour_capped for s in report.queues)
    click.echo(
        f"{'SUBSCRIPTION':<28} {'BACKLOG':>8} {'LAG':>7} {'SCHED':>6} {'FLIGHT':>6} "
        f"{'STUCK':>5} {'DEAD':>6} {'DONE/1H':>8}{'*' if capped else ''}"
    )
    for s in report.queues:
        click.echo(
            f"{s.name:<28} {s.backlog:>8} {_age(s.lag_seconds):>7} {s.scheduled:>6} {s.in_flight:>6} "
            f"{s.stuck:>5} {s.dead:>6} {s.completed_last_hour:>8}"
        )
    if capped:
        click.echo("* at least: counted among the newest 100,000 deliveries")
    click.echo(f"{'EVENT TYPE':<28} {'SUBSCRIPTION':<28} {'STATUS':<11} {'COUNT':>8}")
    for r in report.rows:
        click.echo(f"{r.event_type:<28} {r.subscription:<28} {r.status:<11} {r.count:>8}")
    for w in report.workers:
        listener = "ok" if w.listener_ok else "DOWN"
        lost = f" LOST: {w.rescued} deliveries taken back" if w.rescued else ""
        click.echo(
            f"worker {w.id} {w.hostname}:{w.pid} listener {listener} "
            f"reconnects {w.listener_reconnects} silent {w.silent_seconds:.0f}s{lost}"
        )
    _print_storage(report)


def _print_storage(report: StatusReport) -> None:
    for t in report.tables:
        click.echo(
            f"table {t.table}: {t.live_tuples} live, {t.dead_tuples} dead tuples, "
            f"{t.total_bytes / 1048576:.1f} MiB"
        )
    h = report.horizon
    if h is not None:
        click.echo(
            f"xmin horizon held by pid {h.pid} ({h.state or 'unknown'}, "
            f"{h.application_name or 'no application name'}) for {_age(h.age_seconds)}"
        )
    last = report.last_prune_at
    click.echo(f"last prune: {last.isoformat(timespec='seconds') if last else 'never'}")
