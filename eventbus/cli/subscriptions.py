"""``eventbus subscriptions``: list, pause, resume and remove subscriptions."""

from __future__ import annotations

import click
import msgspec

from ..types import SubscriptionInfo
from ._common import Obj, enc_hook, run
from .audit import acting

__all__ = ["STALE_AFTER_SECONDS", "subscriptions", "unserved_note"]

# Workers report the subscriptions they serve every few seconds; a minute of
# silence means no worker is serving it.
STALE_AFTER_SECONDS = 60.0


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def unserved_note(s: SubscriptionInfo) -> str | None:
    """A warning line for a subscription nothing is serving, or None."""
    if s.state == "paused":
        return f"subscription {s.name} is paused: {s.pending} pending, not claimed until resumed"
    if s.state != "active":
        return None
    if s.silent_seconds is None:
        return f"subscription {s.name} was never served by a worker: {s.pending} pending"
    if s.silent_seconds > STALE_AFTER_SECONDS:
        since = _ago(s.silent_seconds)
        return f"subscription {s.name}: no worker has served it since {since}: {s.pending} pending"
    return None


@click.group()
def subscriptions() -> None:
    """Subscriptions the database knows: list, pause, resume, remove."""


@subscriptions.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_(obj: Obj, as_json: bool) -> None:
    """Every subscription with its state, backlog, lag and last worker report."""

    async def go() -> list[SubscriptionInfo]:
        async with obj.bus() as bus:
            return await bus.list_subscriptions()

    rows = run(go)
    if as_json:
        click.echo(msgspec.json.encode(rows, enc_hook=enc_hook))
        return
    click.echo(
        f"{'SUBSCRIPTION':<28} {'EVENT TYPE':<24} {'STATE':<8} {'PENDING':>8} {'RUNNING':>8} "
        f"{'DEAD':>6} {'LAG':>8}  LAST SEEN BY A WORKER"
    )
    for s in rows:
        lag = "-" if s.lag_seconds is None else f"{s.lag_seconds:.1f}s"
        click.echo(
            f"{s.name:<28} {s.event_type:<24} {s.state:<8} {s.pending:>8} {s.processing:>8} "
            f"{s.dead:>6} {lag:>8}  {_ago(s.silent_seconds)}"
        )


@subscriptions.command()
@click.argument("name")
@click.pass_obj
def pause(obj: Obj, name: str) -> None:
    """Stop claiming NAME; its deliveries keep accumulating."""

    async def go() -> bool:
        async with obj.bus() as bus:
            return await bus.pause_subscription(name, audit=acting())

    click.echo(f"paused {name}" if run(go) else f"{name} was not active: unchanged")


@subscriptions.command()
@click.argument("name")
@click.pass_obj
def resume(obj: Obj, name: str) -> None:
    """Serve NAME again (paused or removed)."""

    async def go() -> bool:
        async with obj.bus() as bus:
            return await bus.resume_subscription(name, audit=acting())

    click.echo(f"resumed {name}" if run(go) else f"{name} was active: unchanged")


@subscriptions.command()
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def remove(obj: Obj, name: str, yes: bool) -> None:
    """Stop fan-out to NAME and cancel its pending deliveries (for a subscription gone from the code)."""
    if not yes:
        click.confirm(f"Remove {name} and cancel its pending deliveries?", abort=True)

    async def go() -> int:
        async with obj.bus() as bus:
            return await bus.remove_subscription(name, audit=acting())

    click.echo(f"removed {name}: {run(go)} pending deliveries cancelled")
