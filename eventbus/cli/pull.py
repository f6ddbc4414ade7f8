"""``eventbus claim | complete | fail | release | extend``: pull claims for scripts, in JSON.

A process in any language claims deliveries of a pulled subscription
(``bus.pull.subscription``), does the work, and settles each delivery by its
id and lease token, in a later command. Each command is one short process:
``claim`` leaves the deliveries claimed when it exits (``bus.pull.take``), and
the others find them again by id and token (``bus.pull.held``), fenced by the
token exactly as in the library. The application (``--app module:bus`` or
``$EVENTBUS_APP``) gives the subscription's event class and retry policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import orjson

from ..bus import Bus
from ..errors import ConfigurationError, Retry
from ..event import Event, encode_event
from ..pull import MAX_CLAIM, Batch, PulledDelivery
from ._common import ID, SECONDS, Obj, load_app, run

__all__ = ["COMMANDS"]

T = TypeVar("T")

APP_OPTION = click.option("--app", envvar="EVENTBUS_APP", help="module:bus that declares the subscription.")
TOKEN_OPTION = click.option("--token", required=True, help="The lease token the claim printed.")


def _on_app(obj: Obj, app: str | None, fn: Callable[[Bus], Awaitable[T]]) -> T:
    async def go() -> T:
        if not app:
            raise ConfigurationError("name the application: --app module:bus (or $EVENTBUS_APP)")
        bus = load_app(app)
        obj.check_worker_target(bus, app)
        async with bus:
            return await fn(bus)

    return run(go)


def _echo(document: Any) -> None:
    click.echo(orjson.dumps(document).decode())


def _delivery_json(d: PulledDelivery) -> dict[str, Any]:
    c = d.delivery
    return {
        "id": d.id,
        "lease_token": d.lease_token,
        "attempt": d.attempt,
        "event_id": d.event_id,
        "event_type": c.event_type,
        "event_version": c.event_version,
        "key": c.key,
        "payload": orjson.loads(encode_event(d.event)),
        "headers": c.headers,
        "correlation_id": c.correlation_id or c.event_id,
        "causation_id": c.causation_id,
        "created_at": c.created_at,
        "run_at": c.run_at,
    }


@click.command()
@click.argument("subscription")
@click.option("--limit", default=10, show_default=True, type=click.IntRange(1, MAX_CLAIM))
@click.option(
    "--lease-seconds",
    type=click.FloatRange(0, 86400, min_open=True),
    help="How long the deliveries stay claimed (default: the subscription's).",
)
@APP_OPTION
@click.pass_obj
def claim(obj: Obj, subscription: str, limit: int, lease_seconds: float | None, app: str | None) -> None:
    """Claim up to --limit deliveries of SUBSCRIPTION and print them as one JSON document.

    They stay claimed after the command exits, until `complete`, `fail` or
    `release` names them with their lease token, or the lease runs out.
    """

    async def go(bus: Bus) -> Batch:
        return await bus.pull.take(subscription, limit=limit, lease_seconds=lease_seconds)

    batch = _on_app(obj, app, go)
    _echo(
        {
            "subscription": batch.subscription.name,
            "lease_seconds": batch.lease_seconds,
            "deliveries": [_delivery_json(d) for d in batch],
        }
    )


Act = Callable[[Bus, PulledDelivery], Awaitable[bool]]


def _settle(obj: Obj, app: str | None, delivery_id: int, token: str, act: Act) -> dict[str, Any]:
    """Find the delivery held under ``token``, apply ``act``; a lost lease is the one error line."""

    async def go(bus: Bus) -> dict[str, Any]:
        pulled = await bus.pull.held(delivery_id, token)
        if not await act(bus, pulled):
            now = (await bus.delivery(delivery_id)).status
            raise click.ClickException(
                f"delivery {delivery_id} is not held under lease token {token} "
                f"(its lease ran out, or it was settled; it is {now} now)"
            )
        after = await bus.delivery(delivery_id)
        return {"id": delivery_id, "status": after.status, "attempts": after.attempts, "run_at": after.run_at}

    return _on_app(obj, app, go)


def _follow_ups(bus: Bus, documents: tuple[str, ...]) -> list[Event]:
    events = []
    for text in documents:
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--follow-up") from exc
        if not (isinstance(doc, dict) and isinstance(doc.get("event_type"), str) and "payload" in doc):
            message = 'give {"event_type": "…", "payload": {…}} (and "event_version" for an older one)'
            raise click.BadParameter(message, param_hint="--follow-up")
        version = doc.get("event_version")
        events.append(bus.validate_payload(doc["event_type"], orjson.dumps(doc["payload"]), version))
    return events


@click.command()
@click.argument("delivery_id", type=ID)
@TOKEN_OPTION
@click.option(
    "--follow-up",
    "follow_ups",
    multiple=True,
    help='An event published with the completion: {"event_type": …, "payload": {…}} (repeatable).',
)
@APP_OPTION
@click.pass_obj
def complete(obj: Obj, delivery_id: int, token: str, follow_ups: tuple[str, ...], app: str | None) -> None:
    """Mark DELIVERY_ID completed, with its follow-up events, in one transaction."""

    async def act(bus: Bus, pulled: PulledDelivery) -> bool:
        return await pulled.complete(follow_ups=_follow_ups(bus, follow_ups))

    _echo(_settle(obj, app, delivery_id, token, act))


@click.command("fail")
@click.argument("delivery_id", type=ID)
@TOKEN_OPTION
@click.option("--error", "message", required=True, help="What went wrong (kept in the attempt history).")
@click.option("--retry/--no-retry", default=True, help="Retry by the subscription's policy, or dead now.")
@click.option("--retry-in", type=SECONDS, help="Seconds to the retry, in place of the backoff.")
@APP_OPTION
@click.pass_obj
def fail_(
    obj: Obj, delivery_id: int, token: str, message: str, retry: bool, retry_in: float | None, app: str | None
) -> None:
    """Record a failed attempt of DELIVERY_ID: retried (by the policy, or --retry-in), or dead."""
    if retry_in is not None and not retry:
        raise click.UsageError("--retry-in and --no-retry contradict each other")
    error: BaseException | str = message if retry_in is None else Retry(delay=retry_in, reason=message)

    async def act(bus: Bus, pulled: PulledDelivery) -> bool:
        return await pulled.fail(error, retry=retry)

    _echo(_settle(obj, app, delivery_id, token, act))


@click.command()
@click.argument("delivery_id", type=ID)
@TOKEN_OPTION
@APP_OPTION
@click.pass_obj
def release(obj: Obj, delivery_id: int, token: str, app: str | None) -> None:
    """Hand DELIVERY_ID back to pending in its place, the attempt not counted."""

    async def act(bus: Bus, pulled: PulledDelivery) -> bool:
        return await pulled.release()

    _echo(_settle(obj, app, delivery_id, token, act))


@click.command()
@click.argument("delivery_id", type=ID)
@TOKEN_OPTION
@click.option(
    "--lease-seconds",
    type=click.FloatRange(0, 86400, min_open=True),
    help="Seconds from now (default: the subscription's lease).",
)
@APP_OPTION
@click.pass_obj
def extend(obj: Obj, delivery_id: int, token: str, lease_seconds: float | None, app: str | None) -> None:
    """Renew the lease of DELIVERY_ID (still under its token)."""

    async def act(bus: Bus, pulled: PulledDelivery) -> bool:
        return await pulled.extend(lease_seconds)

    _echo(_settle(obj, app, delivery_id, token, act))


COMMANDS = (claim, complete, fail_, release, extend)
"""The pull commands, added to the top-level group."""
