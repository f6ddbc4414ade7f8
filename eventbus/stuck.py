"""Acting on stuck and retrying deliveries: retry now, release, cancel.

What each does (``Bus.retry_now``, ``Bus.release_stuck``, ``Bus.cancel``):

``retry now``
    A pending delivery waiting out its backoff (or a delay) becomes due now.
    Its place in the claim order moves with its run_at, so its priority keeps
    its meaning; the subscription's workers are woken as by a publish.
``release``
    A stuck delivery (processing, its lease run out or its worker lost) goes
    back the way a lease recovery sends it: the attempt it was on counts, it
    returns to pending, or ends dead when that was its last attempt. That is
    what the workers' own sweep would do once they get to it, so a release
    only does it sooner and never hands a poison message endless free tries.
    (Workers handing back work they never started release it uncounted; an
    operator releasing a stuck run does not know how far it got.)
``cancel``
    Pending deliveries, and with ``stuck=True`` stuck ones too, end cancelled.

Every move is guarded by the state it expects, and a release or cancel of a
processing delivery clears its lease token: a worker that was only slow and
still finishes the run is refused by the token guard of its result, cleanly.
Each acts on ids (one statement, its audit row in the same transaction) or on
a :class:`~eventbus.types.DeliveryFilter`, walked in id batches, with one
audit row for the whole walk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from .audit import Actor
from .backends.base import Backend
from .errors import ConfigurationError
from .types import DeliveryFilter

__all__ = ["LOST_WORKER_SECONDS", "StuckAction", "act", "describe"]

LOST_WORKER_SECONDS = 30.0
"""A worker silent this long (six missed heartbeats) is lost: its deliveries are stuck."""
StuckAction = Literal["retry", "release", "cancel"]

Apply = Callable[[Sequence[int], "dict[str, Any] | None"], Awaitable[int]]


def describe(flt: DeliveryFilter) -> str:
    """A filter as the audit trail and the confirmations show it (``condition=stuck, subscription=x``)."""
    fields = ("condition", "subscription", "status", "event_type", "key", "event_id", "since", "until")
    parts = [f"{name}={value}" for name in fields if (value := getattr(flt, name)) is not None]
    return ", ".join(parts) or "(every delivery)"


def _apply(
    backend: Backend, action: StuckAction, audit: Actor | None, lost_after_seconds: float, stuck: bool
) -> Apply:
    operate = backend.operate
    if action == "retry":
        return operate.retry_now
    if action == "release":
        message = f"released by {audit.name}" if audit is not None else "released by an operator"

        async def release(ids: Sequence[int], entry: dict[str, Any] | None) -> int:
            return await operate.release_stuck(ids, lost_after_seconds, message, entry)

        return release

    async def cancel(ids: Sequence[int], entry: dict[str, Any] | None) -> int:
        return await operate.cancel(ids, entry, lost_after_seconds if stuck else None)

    return cancel


async def act(
    backend: Backend,
    action: StuckAction,
    target: Sequence[int] | DeliveryFilter,
    *,
    audit: Actor | None,
    lost_after_seconds: float = LOST_WORKER_SECONDS,
    stuck: bool = False,
    batch_size: int = 1000,
) -> int:
    """Apply ``action`` to the ids (or everything matching the filter) ``target``; how many moved."""
    if lost_after_seconds <= 0:
        raise ConfigurationError(f"lost_after_seconds must be positive, got {lost_after_seconds}")
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be at least 1, got {batch_size}")
    apply = _apply(backend, action, audit, lost_after_seconds, stuck)
    if not isinstance(target, DeliveryFilter):
        ids = sorted({int(i) for i in target})
        entry = None if audit is None else audit.entry(action, "ids " + ", ".join(map(str, ids)))
        return await apply(ids, entry)
    total, after = 0, 0
    while batch := await backend.inspect.delivery_ids(target, batch_size, after):
        total += await apply(batch, None)
        after = batch[-1]
    if audit is not None:
        entry = audit.entry(action, "deliveries", describe(target))
        await backend.operate.record_audit({**entry, "count": total})
    return total
