"""``eventbus stuck``: list, retry now, release and cancel stuck and retrying deliveries.

Stuck: processing with its lease run out (the status's "stuck" count), or held
by a lost worker (no heartbeat for ``--lost-after`` seconds). Retrying: pending
after a failed attempt, waiting out its backoff. Each action is guarded (it
moves only deliveries still in the state it expects) and recorded in the
audit trail. See :mod:`eventbus.stuck`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
import msgspec

from ..stuck import LOST_WORKER_SECONDS, StuckAction
from ..types import DeliveryCondition, DeliveryFilter, DeliveryRow
from ._common import ID, Obj, enc_hook, run
from .audit import acting
from .dlq import check_names

__all__ = ["stuck"]


class LostAfter(click.types.FloatParamType):
    """Seconds of silence after which a worker counts as lost: more than 0, at most a day."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not 0 < seconds <= 86400:
            self.fail(f"{value!r} is not a number of seconds above 0 and at most a day", param, ctx)
        return seconds


@click.group()
def stuck() -> None:
    """List and act on stuck and retrying deliveries."""


def _condition(retrying: bool) -> DeliveryCondition:
    return "retrying" if retrying else "stuck"


@stuck.command("list")
@click.option("--retrying", is_flag=True, help="Failed ones waiting out their backoff, not stuck ones.")
@click.option("--subscription", help="Only this subscription.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def list_(obj: Obj, retrying: bool, subscription: str | None, limit: int, as_json: bool) -> None:
    """Stuck deliveries (or, with --retrying, those waiting to retry), newest first."""
    flt = DeliveryFilter(condition=_condition(retrying), subscription=subscription)

    async def go() -> list[DeliveryRow]:
        async with obj.bus() as bus:
            await check_names(bus, flt)
            return await bus.find_deliveries(flt, limit=limit)

    rows = run(go)
    if as_json:
        click.echo(msgspec.json.encode(rows, enc_hook=enc_hook))
        return
    now = datetime.now(UTC)
    for r in rows:
        click.echo(f"{r.id:>8} {r.subscription:<24} {r.event_type:<24} {_when(r, now)}")
    more = " (more not shown)" if len(rows) == limit else ""
    click.echo(f"{len(rows)} {'retrying' if retrying else 'stuck'}{more}")


def _when(r: DeliveryRow, now: datetime) -> str:
    """What a row is waiting for: its next attempt, or its lease and worker."""
    if r.status == "pending":
        return f"attempt {r.attempts + 1} of {r.max_attempts} in {(r.run_at - now).total_seconds():.0f}s"
    lease = "" if r.lease_until is None else f"lease ended {(now - r.lease_until).total_seconds():.0f}s ago"
    return f"{lease} worker {(r.worker_id or '?')[:8]}"


def _act(action: StuckAction, help_all: str, doc: str) -> click.Command:
    @click.argument("ids", nargs=-1, type=ID)
    @click.option("--all", "everything", is_flag=True, help=help_all)
    @click.option("--subscription", help="With --all: only this subscription.")
    @click.option(
        "--lost-after", default=LOST_WORKER_SECONDS, show_default=True, type=LostAfter(),
        help="A worker silent this many seconds is lost: its deliveries are stuck.",
    )  # fmt: skip
    @click.pass_obj
    def command(
        obj: Obj, /, ids: tuple[int, ...], everything: bool, subscription: str | None, lost_after: float,
        **extra: bool,
    ) -> None:  # fmt: skip
        retrying = extra.get("retrying", action == "retry")
        if bool(ids) == everything:
            raise click.UsageError("name delivery IDs or say --all, not both")
        if subscription is not None and not everything:
            raise click.UsageError("--subscription goes with --all")
        flt = DeliveryFilter(condition=_condition(retrying), subscription=subscription)

        async def go() -> int:
            async with obj.bus() as bus:
                await check_names(bus, flt)
                target = flt if everything else list(ids)
                if action == "retry":
                    return await bus.retry_now(target, audit=acting())
                if action == "release":
                    return await bus.release_stuck(target, audit=acting(), lost_after_seconds=lost_after)
                return await bus.cancel(target, audit=acting(), stuck=True, lost_after_seconds=lost_after)

        count = run(go)
        verb = {"retry": "due now", "release": "released", "cancel": "cancelled"}[action]
        skipped = len(set(ids)) - count
        note = f" ({skipped} left alone: not in the state expected)" if skipped > 0 else ""
        click.echo(f"{verb}: {count}{note}")

    command.__doc__ = doc
    return stuck.command(name={"retry": "retry-now"}.get(action, action))(command)


_act(
    "retry", "Every delivery waiting to retry.",
    "Make deliveries waiting out their backoff due now (pending ones only; priorities keep their meaning).",
)  # fmt: skip
_act(
    "release", "Every stuck delivery (lease run out).",
    "Release stuck deliveries as a lease recovery would: the attempt counts, dead when it was the last.",
)  # fmt: skip
_CANCEL = _act(
    "cancel", "Every stuck delivery (lease run out).",
    "Cancel stuck or retrying deliveries; the worker of a stuck one loses on its lease token.",
)  # fmt: skip
click.option("--retrying", is_flag=True, help="With --all: the retrying ones, not the stuck ones.")(_CANCEL)
