"""``eventbus schedule``: list, show, pause, resume, trigger, backfill and remove schedules.

Every command works from the database alone (no application code): a
trigger or a backfill records requested occurrences, which the next tick of
any running worker fires.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import msgspec

from ..bus import Bus
from ..types import OccurrenceInfo, ScheduleInfo
from ._common import COUNT, Obj, enc_hook, run
from .audit import after, no_count

__all__ = ["schedule"]

T = TypeVar("T")


def _on_bus(obj: Obj, fn: Callable[[Bus], Awaitable[T]]) -> T:
    async def go() -> T:
        async with obj.bus() as bus:
            return await fn(bus)

    return run(go)


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def _when(text: str, option: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise click.BadParameter(
            "use an ISO-8601 time (UTC when no zone is given)", param_hint=option
        ) from exc
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _spec(s: ScheduleInfo) -> str:
    return f"cron {s.cron!r} {s.timezone}" if s.cron else f"every {s.every_seconds:g}s"


@click.group()
def schedule() -> None:
    """Recurring schedules: their next and last runs, occurrences and policies."""


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def list_(obj: Obj, as_json: bool) -> None:
    """Every recorded schedule with its next and last run, policy and state."""
    found = _on_bus(obj, lambda bus: bus.schedules.list())
    if as_json:
        click.echo(msgspec.json.encode(found, enc_hook=enc_hook))
        return
    click.echo(f"{'NAME':<24} {'SPEC':<28} {'NEXT':<26} {'LAST RUN':<26} {'POLICY':<28} STATE")
    for s in found:
        policy = f"missed={s.missed} overlap={s.overlap}"
        state = "paused" if s.paused else "active"
        click.echo(
            f"{s.name:<24} {_spec(s):<28} {_time(s.next_occurrence_at):<26} "
            f"{_time(s.last_run_at):<26} {policy:<28} {state}"
        )


@schedule.command()
@click.argument("name")
@click.option("--limit", default=20, show_default=True, type=COUNT, help="Occurrences shown, newest first.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def show(obj: Obj, name: str, limit: int, as_json: bool) -> None:
    """A schedule and its recent occurrences with their fate."""

    async def go(bus: Bus) -> tuple[ScheduleInfo, list[OccurrenceInfo]]:
        return await bus.schedules.info(name), await bus.schedules.occurrences(name, limit)

    info, occurrences = _on_bus(obj, go)
    if as_json:
        click.echo(msgspec.json.encode({"schedule": info, "occurrences": occurrences}, enc_hook=enc_hook))
        return
    for field in msgspec.structs.fields(info):
        click.echo(f"{field.name:<20} {_show(getattr(info, field.name))}")
    click.echo(f"\n{'SCHEDULED FOR':<26} {'STATUS':<16} {'EVENT':>8} {'FIRED':<26} FINISHED")
    for o in occurrences:
        event = "-" if o.event_id is None else str(o.event_id)
        click.echo(
            f"{_time(o.scheduled_for):<26} {o.status:<16} {event:>8} {_time(o.fired_at):<26} "
            f"{_time(o.finished_at)}"
        )


def _show(value: Any) -> str:
    return _time(value) if isinstance(value, datetime) else str(value)


@schedule.command()
@click.argument("name")
@click.pass_obj
def pause(obj: Obj, name: str) -> None:
    """Stop firing NAME (what falls due meanwhile is missed, by its policy)."""
    _on_bus(
        obj, lambda bus: after(bus, bus.schedules.pause(name), "pause", f"schedule {name}", count=no_count)
    )
    click.echo(f"paused {name}")


@schedule.command()
@click.argument("name")
@click.pass_obj
def resume(obj: Obj, name: str) -> None:
    """Fire NAME again."""
    _on_bus(
        obj, lambda bus: after(bus, bus.schedules.resume(name), "resume", f"schedule {name}", count=no_count)
    )
    click.echo(f"resumed {name}")


@schedule.command()
@click.argument("name")
@click.pass_obj
def trigger(obj: Obj, name: str) -> None:
    """Fire NAME once now, with its own key (a running worker fires it at its next tick)."""
    when = _on_bus(
        obj,
        lambda bus: after(bus, bus.schedules.trigger(name), "trigger", f"schedule {name}", count=lambda _: 1),
    )
    click.echo(f"requested {name}@{when.astimezone(UTC).isoformat()}")


@schedule.command()
@click.argument("name")
@click.option("--from", "start", required=True, help="Window start, ISO-8601 (UTC when no zone).")
@click.option("--to", "end", required=True, help="Window end, ISO-8601 (UTC when no zone).")
@click.pass_obj
def backfill(obj: Obj, name: str, start: str, end: str) -> None:
    """Fire the occurrences of NAME in a past window, each at most once."""
    window = _when(start, "--from"), _when(end, "--to")

    async def go(bus: Bus) -> list[datetime]:
        try:
            return await bus.schedules.backfill(name, *window)
        except OverflowError as exc:  # an occurrence before the year 1 or after 9999
            message = "the window reaches past the dates Python can hold"
            raise click.BadParameter(message, param_hint="--from/--to") from exc

    times = _on_bus(obj, go)
    click.echo(f"requested {len(times)} occurrence(s) of {name}")


@schedule.command()
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.pass_obj
def remove(obj: Obj, name: str, yes: bool) -> None:
    """Delete NAME and its occurrence history."""
    if not yes:
        click.confirm(f"remove schedule {name} and its occurrences?", abort=True)
    _on_bus(
        obj, lambda bus: after(bus, bus.schedules.remove(name), "remove", f"schedule {name}", count=no_count)
    )
    click.echo(f"removed {name}")
