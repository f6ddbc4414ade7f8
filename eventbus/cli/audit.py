"""``eventbus audit``, and what the command line's actions record in the audit trail.

``cancel`` and the subscription commands record their row in their own
transaction (``audit=acting()``); other actions record theirs right after the
bus returned, with the count it returned. The operator is ``--by`` where the
command takes one, else ``$EVENTBUS_OPERATOR``, else the login name; the
origin is ``user@host``.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import TypeVar

import click
import msgspec

from ..audit import ACTIONS, MAX_AUDIT_ROWS, Actor, AuditEntry
from ..bus import Bus
from ._common import ID, Obj, enc_hook, run

__all__ = ["acting", "after", "audit", "count_of", "no_count"]

T = TypeVar("T")


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment or the password database
        return f"uid {os.getuid()}"


def count_of(done: object) -> int | None:
    """The count an action returned: a number as it is, True/False as 1/0, anything else none."""
    return int(done) if isinstance(done, int) else None


def no_count(done: object) -> None:
    """For actions that return no count (a schedule's pause or resume)."""
    return None


async def after(
    bus: Bus,
    done: Awaitable[T],
    action: str,
    target: str,
    *,
    count: Callable[[T], int | None] = count_of,
    filter: str | None = None,
    by: str | None = None,
) -> T:
    """Await the action ``done``, then record it in the audit trail with the count it returned."""
    result = await done
    who = acting(by)
    await bus.audit.record(
        action, target, actor=who.name, origin=who.origin, interface="cli", count=count(result), filter=filter
    )
    return result


def acting(by: str | None = None) -> Actor:
    """Who runs this command, from where."""
    name = by or os.environ.get("EVENTBUS_OPERATOR") or _user()
    return Actor(name, f"{_user()}@{socket.gethostname()}", "cli")


@click.command()
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, MAX_AUDIT_ROWS))
@click.option("--action", type=click.Choice(ACTIONS), help="Only this action.")
@click.option("--actor", help="Only this operator's actions.")
@click.option("--before", type=ID, help="Only rows older than this id (the next page).")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@click.pass_obj
def audit(
    obj: Obj, limit: int, action: str | None, actor: str | None, before: int | None, as_json: bool
) -> None:
    """The audit trail of operator actions, newest first."""

    async def go() -> list[AuditEntry]:
        async with obj.bus() as bus:
            return await bus.audit.entries(limit=limit, action=action, actor=actor, before=before)

    rows = run(go)
    if as_json:
        click.echo(msgspec.json.encode(rows, enc_hook=enc_hook))
        return
    head = f"{'ID':>6} {'AT (UTC)':<19} {'OPERATOR':<12} {'FROM':<20}"
    click.echo(f"{head} {'VIA':<9} {'ACTION':<8} {'COUNT':>6}  TARGET")
    for r in rows:
        count = "-" if r.count is None else str(r.count)
        shown = r.target + (f" [{r.filter}]" if r.filter else "")
        at = f"{r.at.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
        who = f"{r.id:>6} {at:<19} {r.actor:<12} {r.origin:<20}"
        click.echo(f"{who} {r.interface:<9} {r.action:<8} {count:>6}  {shown}")
