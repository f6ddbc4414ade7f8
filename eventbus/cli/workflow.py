"""``eventbus workflow``: inspect and operate the state machines of an application.

Every command loads the application (``--app module:bus`` or ``$EVENTBUS_APP``)
for its machine definitions; writes are guarded and audited in the history.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, get_args

import click
import msgspec

from ..bus import Bus
from ..errors import ConfigurationError
from ..types import WorkflowStatus
from ..workflows import DefinitionReport, Instance
from ..workflows import diagram as render_diagram
from ._common import COUNT, ID, SECONDS, Obj, enc_hook, load_app, run
from .audit import after

__all__ = ["workflow"]

T = TypeVar("T")


class _WorkflowObj(msgspec.Struct):
    outer: Obj
    app: str | None


def _with_bus(obj: _WorkflowObj, fn: Callable[[Bus], Awaitable[T]]) -> T:
    async def go() -> T:
        if not obj.app:
            raise ConfigurationError("name the application: --app module:bus (or $EVENTBUS_APP)")
        bus = load_app(obj.app)
        if obj.outer.dsn and obj.outer.dsn != bus.dsn:
            raise ConfigurationError(f"--dsn differs from the DSN {obj.app} was built with")
        async with bus:
            return await fn(bus)

    return run(go)


@click.group()
@click.option("--app", envvar="EVENTBUS_APP", help="module:bus that includes the machines.")
@click.pass_context
def workflow(ctx: click.Context, app: str | None) -> None:
    """Durable state machines: inspect, operate, decide approvals, draw and check them."""
    ctx.obj = _WorkflowObj(ctx.obj, app)


async def _check_state(bus: Bus, machine: str, state: str) -> None:
    """Refuse a state MACHINE neither declares nor has instances in (a typo would list nothing)."""
    m = bus.workflows.machine(machine)
    if state in m.states:
        return
    if any(found == state for found, _ in await bus.workflows.counts(m)):
        return  # a state gone from the table that instances are still in
    declared = ", ".join(sorted(m.states))
    message = f"machine {m.name!r} has no state {state!r} (it has: {declared})"
    raise click.BadParameter(message, param_hint="--state")


@workflow.command("list")
@click.argument("machine")
@click.option("--status", type=click.Choice(get_args(WorkflowStatus)), help="Only instances in this status.")
@click.option("--state", help="Only instances in this state.")
@click.option("--limit", default=1000, show_default=True, type=COUNT)
@click.pass_obj
def list_(obj: _WorkflowObj, machine: str, status: str | None, state: str | None, limit: int) -> None:
    """Instances of MACHINE, by key."""

    async def go(bus: Bus) -> list[Instance[Any]]:
        if state is not None:
            await _check_state(bus, machine, state)
        return await bus.workflows.instances(machine, status=status, state=state, limit=limit)

    rows = _with_bus(obj, go)
    click.echo(f"{'KEY':<24} {'STATE':<20} {'STATUS':<17} {'RUN':>4} {'VERSION':>8}  NEXT RUN")
    for i in rows:
        next_run = i.next_run_at.isoformat(timespec="seconds") if i.next_run_at else "-"
        click.echo(f"{i.key:<24} {i.state:<20} {i.status:<17} {i.run_id:>4} {i.version:>8}  {next_run}")


@workflow.command()
@click.argument("machine")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def show(obj: _WorkflowObj, machine: str, key: str, as_json: bool) -> None:
    """The pointer, checkpoint, history, signals and approvals of one instance."""

    async def go(bus: Bus) -> dict[str, Any]:
        return {
            "instance": await bus.workflows.instance(machine, key),
            "history": await bus.workflows.history(machine, key),
            "signals": await bus.workflows.signals(machine, key, open_only=True),
            "approvals": await bus.workflows.approvals(machine, key),
        }

    found = _with_bus(obj, go)
    if as_json:
        click.echo(msgspec.json.encode(found, enc_hook=enc_hook))
        return
    i = found["instance"]
    click.echo(f"{i.machine}/{i.key}: {i.state} ({i.status}), run {i.run_id}, version {i.version}")
    click.echo(f"visits: {i.visits}")
    click.echo(f"checkpoint: {msgspec.json.encode(i.checkpoint).decode()}")
    if i.last_error:
        click.echo(f"last error: [{i.last_error_code}] {i.last_error}")
    if i.next_run_at:
        click.echo(f"next run: {i.next_run_at.isoformat(timespec='seconds')}")
    click.echo("history:")
    for h in found["history"]:
        extra = f" [{h.error_code}] {h.error}" if h.error else ""
        why = f" ({h.reason})" if h.reason and not h.error else ""
        visit = f"v{h.version} run {h.run_id} {h.state}#{h.visit}"
        click.echo(f"  {visit} {h.outcome} -> {h.next_state} by {h.actor}{why}{extra}")
    for s in found["signals"]:
        click.echo(f"open signal {s.id}: {s.name} {s.payload.decode('utf-8', 'replace')}")
    for a in found["approvals"]:
        decided = f" by {a.decided_by}" if a.decided_by else ""
        expires = a.expires_at.isoformat(timespec="seconds")
        click.echo(f"approval {a.id}: {a.state} {a.status}{decided}, expires {expires}")


@workflow.command()
@click.argument("machine")
@click.argument("key")
@click.option("--to", "to", required=True, help="The state to move to.")
@click.option("--reason", required=True, help="Why (kept in the history).")
@click.option("--expect", help="Refuse unless the instance is in this state.")
@click.option("--by", default="operator", show_default=True, help="Who does it.")
@click.pass_obj
def repoint(
    obj: _WorkflowObj, machine: str, key: str, to: str, reason: str, expect: str | None, by: str
) -> None:
    """Move an instance to another state (guarded, fences a visit in flight, audited)."""
    details = f"to={to}, reason={reason}" + (f", expect={expect}" if expect else "")

    def act(bus: Bus) -> Awaitable[int]:
        done = bus.workflows.repoint(machine, key, to=to, reason=reason, by=by, expect=expect)
        return after(
            bus, done, "repoint", f"instance {machine}/{key}", count=lambda _: 1, filter=details, by=by
        )

    version = _with_bus(obj, act)
    click.echo(f"{machine}/{key} repointed to {to} (version {version})")


def _operation(name: str, doc: str) -> None:
    @workflow.command(name, help=doc)
    @click.argument("machine")
    @click.argument("key")
    @click.option("--by", default="operator", show_default=True, help="Who does it.")
    @click.option("--reason", help="Why (kept in the history).")
    @click.pass_obj
    def command(obj: _WorkflowObj, machine: str, key: str, by: str, reason: str | None) -> None:
        def act(bus: Bus) -> Awaitable[int]:
            fn = {
                "cancel": bus.workflows.cancel,
                "pause": bus.workflows.pause,
                "resume": bus.workflows.resume,
            }[name]
            done = fn(machine, key, by=by, reason=reason)
            details = f"reason={reason}" if reason else None
            return after(
                bus, done, name, f"instance {machine}/{key}", count=lambda _: 1, filter=details, by=by
            )

        version = _with_bus(obj, act)
        click.echo(f"{machine}/{key}: {name} done (version {version})")


_operation("cancel", "End a live run in CANCELLED.")
_operation("pause", "Stop visiting an instance until resume (fences a visit in flight).")
_operation("resume", "Continue a paused instance.")


@workflow.command()
@click.argument("machine")
@click.argument("key")
@click.option(
    "--as", "outcome", required=True, type=click.Choice(["succeeded", "failed", "retry", "compensate"])
)
@click.option("--by", required=True, help="Who decides.")
@click.option("--reason", help="Why (kept in the history).")
@click.pass_obj
def resolve(obj: _WorkflowObj, machine: str, key: str, outcome: str, by: str, reason: str | None) -> None:
    """Record a human's choice for an uncertain instance and continue."""
    details = f"outcome={outcome}" + (f", reason={reason}" if reason else "")

    def act(bus: Bus) -> Awaitable[int]:
        done = bus.workflows.resolve(machine, key, outcome=outcome, by=by, reason=reason)
        return after(
            bus, done, "resolve", f"instance {machine}/{key}", count=lambda _: 1, filter=details, by=by
        )

    version = _with_bus(obj, act)
    click.echo(f"{machine}/{key} resolved as {outcome} (version {version})")


def _decision(name: str, doc: str) -> None:
    @workflow.command(name, help=doc)
    @click.argument("approval_id", type=ID)
    @click.option("--by", required=True, help="Who decides.")
    @click.option("--reason", help="Why.")
    @click.pass_obj
    def command(obj: _WorkflowObj, approval_id: int, by: str, reason: str | None) -> None:
        def act(bus: Bus) -> Awaitable[Any]:
            fn = bus.workflows.approve if name == "approve" else bus.workflows.deny
            return after(bus, fn(approval_id, by=by, reason=reason), name, f"approval {approval_id}",
                         count=lambda _: 1, by=by)  # fmt: skip

        row = _with_bus(obj, act)
        click.echo(
            f"approval {row.id} ({row.machine}/{row.key} {row.state}): {row.status} by {row.decided_by}"
        )


_decision("approve", "Approve a pending request (once, before it expires).")
_decision("deny", "Deny a pending request.")


@workflow.command()
@click.argument("machine")
@click.option(
    "--format", "fmt", type=click.Choice(["mermaid", "dot", "svg"]), default="mermaid", show_default=True
)
@click.option("--live", is_flag=True, help="Add instance counts per state.")
@click.pass_obj
def diagram(obj: _WorkflowObj, machine: str, fmt: str, live: bool) -> None:
    """Draw MACHINE's state table (yield points, caps, approval and signal edges)."""

    async def go(bus: Bus) -> str:
        m = bus.workflows.machine(machine)
        return render_diagram(m, fmt, await bus.workflows.counts(m) if live else None)

    click.echo(_with_bus(obj, go), nl=False)


@workflow.command()
@click.argument("machines", nargs=-1)
@click.pass_obj
def check(obj: _WorkflowObj, machines: tuple[str, ...]) -> None:
    """Compare each machine's table with the one in force and list the live instances a change touches.

    The table in force is the one the last worker to start recorded. Exits
    non-zero when live instances sit in states the table no longer has (and
    no ``renamed=`` says where they went).
    """

    async def go(bus: Bus) -> list[DefinitionReport]:
        return [await bus.workflows.changes(name) for name in machines or tuple(bus.workflows.machines)]

    reports = _with_bus(obj, go)
    for r in reports:
        if r.changed:
            assert r.stored_hash is not None
            click.echo(f"{r.machine}: the table changed ({r.stored_hash[:12]} in force -> {r.def_hash[:12]})")
            for line in r.change.lines():
                click.echo(f"  {line}")
    rows = [(r.machine, row) for r in reports for row in r.live]
    if rows:
        click.echo(f"{'MACHINE':<20} {'STATE':<20} {'STATUS':<17} {'COUNT':>6}  {'VERDICT':<8} DETAIL")
    for machine, row in rows:
        click.echo(
            f"{machine:<20} {row.state:<20} {row.status:<17} {row.count:>6}  {row.verdict:<8} {row.detail}"
        )
    problems = [p for r in reports for p in r.problems]
    if problems:
        raise click.ClickException(
            f"{len(problems)} problem(s): live instances in states their table no longer has "
            "(declare renamed={'OLD': 'NEW'} or repoint them)"
        )
    click.echo("ok: every live instance is in a state its machine declares")


@workflow.command()
@click.argument("machine", required=False)
@click.option("--grace", type=SECONDS, help="Seconds overdue before a step counts as lost.")
@click.pass_obj
def sweep(obj: _WorkflowObj, machine: str | None, grace: float | None) -> None:
    """Re-publish a step for instances whose tick was lost (this also runs by itself)."""
    found = _with_bus(obj, lambda bus: bus.workflows.sweep(machine, grace_seconds=grace))
    click.echo(f"re-published {found} lost step(s)")
