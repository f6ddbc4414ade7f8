"""``eventbus dlq``: list, show, replay and purge dead deliveries."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import click
import msgspec

from ..bus import Bus
from ..triage import DEFAULT_SAMPLE, Triage, error_groups, failing
from ..types import DeliveryDetail, DeliveryFilter, DeliveryRow, SubscriptionInfo
from ._common import COUNT, ID, Obj, enc_hook, run
from .audit import after

__all__ = ["dlq"]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str | None) -> datetime | None:
    """``30m``, ``2h``, ``1d`` ago, or an ISO-8601 time (UTC when no zone is given)."""
    if text is None:
        return None
    match = _RELATIVE.match(text)
    try:
        if match:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
            return datetime.now(UTC) - timedelta(seconds=seconds)
        when = datetime.fromisoformat(text)
        return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    except OverflowError as exc:
        raise click.BadParameter(f"{text} is before the year 1 in UTC", param_hint="--since") from exc
    except ValueError as exc:
        raise click.BadParameter("use 30m, 2h, 1d or an ISO-8601 time", param_hint="--since") from exc


def _filters(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--payload-contains", help="Only events whose payload contains this text (any case).")(f)
    f = click.option("--error-contains", help="Only those whose last error contains this text (any case).")(f)
    f = click.option("--since", help="Dead since (30m, 2h, 1d or ISO-8601).")(f)
    f = click.option("--event-type", help="Only this event type.")(f)
    f = click.option("--subscription", help="Only this subscription.")(f)
    return f


def _make_filter(
    ids: tuple[int, ...], texts: dict[str, str | None], everything: bool = True
) -> DeliveryFilter:
    """A filter for the named rows (``texts``: the filter options); bulk commands must name
    something or say --all."""
    if not (ids or any(v is not None for v in texts.values()) or everything):
        raise click.UsageError(
            "name delivery IDs, a filter (--subscription, --event-type, --since, --error-contains, "
            "--payload-contains) or --all"
        )
    return DeliveryFilter(
        status="dead",
        ids=list(ids) or None,
        subscription=texts["subscription"],
        event_type=texts["event_type"],
        since=parse_since(texts["since"]),
        error_contains=texts["error_contains"],
        payload_contains=texts["payload_contains"],
    )


async def check_names(bus: Bus, flt: DeliveryFilter) -> None:
    """Refuse a ``--subscription`` or ``--event-type`` that nothing has: a typo would match nothing.

    A name is known when the bus registers it or the database records it (a
    subscription, its event type, or an event type in the log), so names of
    subscriptions gone from the code still work.
    """
    if flt.subscription is None and flt.event_type is None:
        return
    recorded = await bus.list_subscriptions()
    names = {s.name for s in recorded} | set(bus.subscriptions)
    if flt.subscription is not None and flt.subscription not in names:
        raise click.BadParameter(
            f"no subscription named {flt.subscription!r} ({_known(names)})", param_hint="--subscription"
        )
    if flt.event_type is not None and not await _known_event_type(bus, flt.event_type, recorded):
        raise click.BadParameter(f"no event type {flt.event_type!r} is recorded", param_hint="--event-type")


async def _known_event_type(bus: Bus, name: str, recorded: list[SubscriptionInfo]) -> bool:
    types = {s.event_type for s in recorded} | {s.event_type for s in bus.subscriptions.values()}
    if name in types:
        return True
    details = await bus.backend.inspect.health()  # every event type in the log, by an index skip scan
    return any(t.event_type == name for t in details.event_types)


def _known(names: set[str]) -> str:
    shown = sorted(names)[:10]
    more = f", … {len(names) - len(shown)} more" if len(names) > len(shown) else ""
    return f"known: {', '.join(shown)}{more}" if shown else "none is recorded"


@click.group()
def dlq() -> None:
    """Dead-letter queue: deliveries that ran out of attempts or could not decode."""


@dlq.command("list")
@_filters
@click.option("--limit", default=100, show_default=True, type=COUNT)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def list_(obj: Obj, /, limit: int, as_json: bool, **texts: str | None) -> None:
    """List dead deliveries, oldest first."""
    flt = _make_filter((), texts)

    async def go() -> list[DeliveryRow]:
        async with obj.bus() as bus:
            await check_names(bus, flt)
            return await bus.dead_letters(
                subscription=flt.subscription, event_type=flt.event_type, since=flt.since, limit=limit,
                error_contains=flt.error_contains, payload_contains=flt.payload_contains,
            )  # fmt: skip

    rows = run(go)
    if as_json:
        click.echo(msgspec.json.encode([_summary(d) for d in rows], enc_hook=enc_hook))
        return
    click.echo(f"{'ID':>8} {'SUBSCRIPTION':<24} {'EVENT TYPE':<22} {'ATT':>3} {'REPLAYS':>7}  ERROR")
    for d in rows:
        error = (d.last_error or "").splitlines()[0][:60] if d.last_error else ""
        click.echo(
            f"{d.id:>8} {d.subscription:<24} {d.event_type:<22} {d.attempts:>3} {d.replays:>7}  {error}"
        )


def _summary(d: DeliveryRow) -> dict[str, Any]:
    return {
        "id": d.id,
        "event_id": d.event_id,
        "subscription": d.subscription,
        "event_type": d.event_type,
        "event_version": d.event_version,
        "attempts": d.attempts,
        "replays": d.replays,
        "last_error": d.last_error,
        "updated_at": d.updated_at,
    }


@dlq.command()
@_filters
@click.option("--failing", "retrying", is_flag=True, help="Failing ones waiting to retry, not dead ones.")
@click.option("--sample", default=DEFAULT_SAMPLE, show_default=True, type=COUNT, help="Newest ones grouped.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def groups(obj: Obj, /, retrying: bool, sample: int, as_json: bool, **texts: str | None) -> None:
    """Group dead letters (or failing deliveries) by subscription and normalised error, largest first."""
    flt = _make_filter((), texts)
    flt = failing(flt) if retrying else flt

    async def go() -> Triage:
        async with obj.bus() as bus:
            await check_names(bus, flt)
            return await error_groups(bus, flt, sample=sample)

    found = run(go)
    if as_json:
        click.echo(msgspec.json.encode(found, enc_hook=enc_hook))
        return
    if found.capped:
        click.echo(f"the newest {found.scanned} grouped: counts are at least these")
    click.echo(f"{'COUNT':>7} {'SUBSCRIPTION':<24} {'LAST SEEN':<19}  ERROR")
    for g in found.groups:
        click.echo(f"{g.count:>7} {g.subscription:<24} {g.last_seen:%Y-%m-%d %H:%M:%S}  {g.message[:100]}")


@dlq.command()
@click.argument("delivery_id", type=ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def show(obj: Obj, delivery_id: int, as_json: bool) -> None:
    """Show one delivery: payload, headers, lineage and every failed attempt."""

    async def go() -> DeliveryDetail:
        async with obj.bus() as bus:
            return await bus.delivery(delivery_id)

    d = run(go)
    if as_json:
        click.echo(msgspec.json.encode(d, enc_hook=enc_hook))
        return
    click.echo(
        f"delivery {d.id}  status {d.status}  attempts {d.attempts}  replays {d.replays}"
        f"  priority {d.priority}"
    )
    click.echo(
        f"subscription {d.subscription}  event {d.event_id} ({d.event_type} v{d.event_version}) key {d.key}"
    )
    click.echo(
        f"correlation {d.correlation_id}  causation {d.causation_id}  created {d.created_at.isoformat()}"
    )
    click.echo(f"headers {msgspec.json.encode(d.headers).decode()}")
    click.echo(f"payload {d.payload.decode('utf-8', 'replace')}")
    click.echo(f"last error: {d.last_error}")
    for a in d.history:
        click.echo(
            f"--- attempt {a.attempt} at {a.failed_at.isoformat()} on worker "
            f"{a.worker_id} ({a.duration_seconds:.3f}s): {a.error_type}: {a.message}"
        )
        if a.traceback:
            click.echo(a.traceback.rstrip())


async def _count_matching(bus: Bus, flt: DeliveryFilter, batch_size: int) -> int:
    total = 0
    async for ids in bus.dead_id_batches(flt, batch_size):
        total += len(ids)
    return total


def _progress(total: int) -> None:
    """A running count on a terminal; scripts (stderr not a terminal) see nothing."""
    if sys.stderr.isatty():
        click.echo(f"\r{total} deliveries", nl=False, err=True)


def _bulk(action: str) -> Callable[..., None]:
    @click.argument("ids", nargs=-1, type=ID)
    @_filters
    @click.option("--all", "everything", is_flag=True, help="Every dead delivery.")
    @click.option("--dry-run", is_flag=True, help="Count, change nothing.")
    @click.option("--batch-size", default=1000, show_default=True, type=COUNT)
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @click.pass_obj
    def command(
        obj: Obj,
        /,
        ids: tuple[int, ...],
        everything: bool,
        dry_run: bool,
        batch_size: int,
        yes: bool,
        **texts: str | None,
    ) -> None:
        flt = _make_filter(ids, texts, everything)

        async def go() -> int:
            async with obj.bus() as bus:
                await check_names(bus, flt)
                if action == "purge" and not (dry_run or yes):
                    await anyio.to_thread.run_sync(_confirm_purge)
                if dry_run:
                    return await _count_matching(bus, flt, batch_size)
                apply = bus.replay if action == "replay" else bus.purge
                target, used = _audit_target(flt)
                count = await after(bus, apply(flt, batch_size, _progress), action, target, filter=used)
                if sys.stderr.isatty():
                    click.echo("", err=True)
                return count

        count = run(go)
        verb = {"replay": "replayed", "purge": "purged"}[action]
        click.echo(f"{'would be ' if dry_run else ''}{verb}: {count}")

    command.__doc__ = {
        "replay": "Move dead deliveries back to pending (attempts reset, replay counted).",
        "purge": "Delete dead deliveries and their attempt history.",
    }[action]
    return command


def _audit_target(flt: DeliveryFilter) -> tuple[str, str | None]:
    """The audit trail's target and filter: the ids given, or the filter used."""
    if flt.ids is not None:
        return "ids " + ", ".join(map(str, flt.ids)), None
    parts = [f"{k}={v}" for k, v in (("subscription", flt.subscription), ("event_type", flt.event_type),
                                     ("since", flt.since)) if v is not None]  # fmt: skip
    return "dead letters", "all matching " + (", ".join(parts) or "(every dead letter)")


def _confirm_purge() -> None:
    click.confirm("Delete the matching dead deliveries and their history?", abort=True)


dlq.command("replay")(_bulk("replay"))
dlq.command("purge")(_bulk("purge"))
