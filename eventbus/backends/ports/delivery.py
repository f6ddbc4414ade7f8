"""The hot path: publishing, claiming, settling and leasing deliveries, and the wake-ups."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

import msgspec
import orjson

from ...errors import BackendError
from ...types import DeliveryId, EventId, PublishResult, StartFrom

__all__ = [
    "ChangeFeed",
    "ClaimedDelivery",
    "Completion",
    "DeliveryStore",
    "Failure",
    "HandlerTransaction",
    "LeaseKey",
    "LockWaitExceeded",
    "OutgoingEvent",
    "Rescue",
    "SubscriptionSpec",
    "Wakeups",
    "WorkflowStart",
    "decode_headers",
    "warn_not_active",
]

log = logging.getLogger("eventbus")


LeaseKey = tuple[DeliveryId, str]
"""A delivery under one lease token: what a handler result is fenced by."""


class LockWaitExceeded(BackendError):
    """A serial publish waited its bound for a row lock another transaction holds; nothing was published.

    Raised by :meth:`DeliveryStore.publish_serial` only: typically an event's
    (type, key) inserted by a transaction still open (``publish(connection=…)``).
    The caller sends the events again with :meth:`DeliveryStore.publish`,
    which waits for that transaction as long as it takes.
    """


class OutgoingEvent(msgspec.Struct, frozen=True):
    """An encoded event on its way into the log (checked: it can be stored as it is)."""

    event_type: str
    payload: bytes
    key: str | None = None
    headers_json: str = "{}"
    """The headers, encoded once as a JSON object."""
    delay_seconds: float = 0.0
    correlation_id: int | None = None
    causation_id: int | None = None
    ordering_key: str | None = None
    keep_key: bool = False
    """Keep the key for good (``once=True``): honoured past the dedup window, whatever retention deletes."""
    event_version: int = 1
    """The version of the event's class, stored with it (upcasters read older ones)."""
    priority: int = 0
    """Lower runs first within a subscription (checked: 0 to 9)."""


class SubscriptionSpec(msgspec.Struct, frozen=True):
    """What a worker records about a subscription when it starts."""

    name: str
    event_type: str
    max_attempts: int
    lease_seconds: float
    ordered: bool = False
    start_from: StartFrom = "earliest"


class ClaimedDelivery(msgspec.Struct):
    """A delivery this worker owns until its lease runs out."""

    id: DeliveryId
    event_id: EventId
    subscription_id: int
    attempts: int
    lease_token: str
    event_type: str
    payload: bytes
    headers: dict[str, str]
    key: str | None
    correlation_id: int | None
    ordering_key: str | None
    created_at: datetime
    position: Any = None
    """Where the row sits in its subscription's claim order, for ``claim(after=…)``."""
    run_at: datetime | None = None
    """When the delivery became runnable (for pickup-latency figures)."""
    causation_id: int | None = None
    """The event whose handler emitted this one."""
    event_version: int = 1
    """The version the event was published at."""
    priority: int = 0
    """The priority the event was published with."""


class WorkflowStart(msgspec.Struct, frozen=True):
    """A run of a state machine to start: the instance ``(machine, key)`` in ``state``.

    Applied as :meth:`WorkflowStore.start` applies it: a live run is left
    alone; with ``once``, so is a run that completed.
    """

    machine: str
    key: str
    state: str
    checkpoint: bytes
    once: bool = False
    priority: int = 0
    """The run's priority: kept on the instance, every step of the run is published with it."""


class Completion(msgspec.Struct, frozen=True):
    """A successful handler run, the follow-up events it emitted and the runs it started."""

    delivery_id: DeliveryId
    lease_token: str
    follow_ups: Sequence[OutgoingEvent] = ()
    starts: Sequence[WorkflowStart] = ()
    """Runs started with the completion (``ctx.start``), in the same transaction."""

    @property
    def lease(self) -> LeaseKey:
        return (self.delivery_id, self.lease_token)


class Failure(msgspec.Struct, frozen=True):
    """A failed attempt: retried after ``retry_delay_seconds`` unless ``dead``."""

    delivery_id: DeliveryId
    lease_token: str
    dead: bool
    retry_delay_seconds: float
    error_type: str
    message: str
    traceback: str
    duration_seconds: float
    worker_id: str
    subscription: str = ""
    event_id: int = 0
    attempt: int = 0
    """Which run failed (for the log; the database counts attempts itself)."""

    @property
    def lease(self) -> LeaseKey:
        return (self.delivery_id, self.lease_token)

    @classmethod
    def of(
        cls,
        delivery: ClaimedDelivery,
        exc: BaseException,
        *,
        dead: bool,
        retry_delay_seconds: float,
        duration_seconds: float,
        worker_id: str,
        subscription: str,
    ) -> Failure:
        """The failed attempt of ``delivery`` that raised ``exc``, its texts made storable."""
        return cls(
            delivery_id=delivery.id,
            lease_token=delivery.lease_token,
            dead=dead,
            retry_delay_seconds=retry_delay_seconds,
            error_type=_storable(type(exc).__qualname__),
            message=_storable((str(exc) or repr(exc))[:4000]),
            traceback=_storable("".join(traceback.format_exception(exc))[-16000:]),
            duration_seconds=duration_seconds,
            worker_id=worker_id,
            subscription=subscription,
            event_id=delivery.event_id,
            attempt=delivery.attempts,
        )


def _storable(text: str) -> str:
    """Text every backend can store: NUL characters and lone surrogates escaped."""
    text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def warn_not_active(name: str, state: str) -> None:
    """Tell the operator of a worker that it serves a subscription nothing is claimed from."""
    log.warning(
        "subscription %s is %s: nothing of it is claimed until `eventbus subscriptions resume %s`",
        name,
        state,
        name,
    )


class Rescue(msgspec.Struct, frozen=True):
    """The processing deliveries taken back from one lost worker by one rescue pass."""

    worker_id: str
    hostname: str
    pid: int
    silent_seconds: float
    """Since the worker's last heartbeat, by the database's clock."""
    reason: str
    """``"silent"`` (no heartbeat for the threshold) or ``"process gone"`` (its process
    no longer exists on this host)."""
    deliveries: int


class HandlerTransaction(Protocol):
    """The open transaction a transactional handler writes in (see :meth:`DeliveryStore.transaction`)."""

    @property
    def connection(self) -> Any:
        """The driver's connection inside the transaction (asyncpg, or aiosqlite), as ``ctx.connection``."""
        ...

    async def commit(self, completion: Completion) -> bool:
        """Apply ``completion`` in this transaction and commit it with everything written before.

        Fenced as :meth:`DeliveryStore.complete` fences: when the lease no
        longer holds (lost, recovered, or the delivery cancelled) the whole
        transaction rolls back, the handler's writes with it, and this returns
        False.
        """
        ...


def decode_headers(text: str | None) -> dict[str, str]:
    """Headers as stored (JSON text) back to a dict; anything else is empty."""
    if not text or text == "{}":
        return {}
    value = orjson.loads(text)
    return value if isinstance(value, dict) else {}


class DeliveryStore(Protocol):
    """The hot path: what publishers and workers call for every event."""

    async def publish(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Append ``events`` and fan each out to every subscription of its type, atomically.

        Results are in input order. An event whose (type, key) is already in
        the log inserts nothing and returns the earlier id with
        ``duplicate=True``; so does a key repeated inside the batch. Workers
        waiting on the event types are woken after the commit.
        """
        ...

    async def publish_serial(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """As :meth:`publish`, for a caller that sends one batch at a time (the coalescer).

        A backend may keep a connection for it, so that a lone publish pays no
        pool acquire and release; calls that do overlap wait for each other.
        So that one blocked key cannot hold up every later call, a call waits
        a bounded time for a row lock (a key another open transaction
        inserted) and then raises :class:`LockWaitExceeded`, having published
        nothing.
        """
        ...

    async def register(self, specs: Sequence[SubscriptionSpec], *, served: bool = False) -> dict[str, int]:
        """Record subscriptions (create or update) and return their ids by name.

        A subscription seen for the first time with ``start_from="earliest"``
        gets exactly one delivery for every event of its type committed before
        or after the registration, whatever publish transactions overlapped it
        (how long they stayed open, their isolation level): what a backfill
        cannot see yet is owed durably and finished by :meth:`finish_backfills`.
        A paused or removed subscription keeps its state. With ``served`` (a
        worker registering what it serves) the subscriptions count as seen by
        a worker now.
        """
        ...

    async def finish_backfills(self) -> int:
        """Complete owed backfills whose overlapping transactions have all ended; return how many.

        Idempotent and safe to call from any number of processes at once:
        housekeeping calls it periodically. A backfill stays owed, never
        dropped, for as long as an overlapping transaction stays open.
        """
        ...

    async def claim(
        self,
        subscription_id: int,
        limit: int,
        lease_seconds: float,
        worker_id: str,
        ordered: bool = False,
        after: Any = None,
    ) -> list[ClaimedDelivery]:
        """Move up to ``limit`` runnable pending deliveries to processing under one new lease token.

        Each claim counts an attempt. No delivery is held by two claims whose
        leases are both live. With ``ordered``, a keyed delivery is taken only
        as the head of its key (its earliest pending or processing delivery by
        event order) while no delivery of the key is processing: FIFO per key.
        Runnable deliveries are taken in their place order: ``run_at`` plus
        the wait their priority is worth (the priority times the bus's
        ``priority_step_seconds``), ties by ``run_at`` and id.
        ``after`` is a claim cursor (a previous delivery's ``position``): rows
        before it are not looked at.
        """
        ...

    async def complete(self, completions: Sequence[Completion]) -> set[LeaseKey]:
        """Mark deliveries completed, insert their follow-ups and start their runs, in one transaction.

        Only a completion whose lease token still holds is applied, and only
        its follow-ups are inserted and its runs started (a stale run of the
        same delivery in the same batch adds none); the (id, token) pairs
        applied are returned, and a refused one changes nothing.
        """
        ...

    def transaction(self, timeout_seconds: float) -> AbstractAsyncContextManager[HandlerTransaction]:
        """Open the transaction of one transactional handler run, of at most ``timeout_seconds``.

        The handler writes through its ``connection``; :meth:`HandlerTransaction.commit`
        completes the delivery in it. Leaving the block without a commit (the
        handler raised, timed out or was cancelled) rolls everything back.
        Through a transaction pooler it is one server transaction, as any.
        A backend may refuse a timeout it cannot honour (:class:`ConfigurationError`).
        """
        ...

    async def fail(self, failures: Sequence[Failure]) -> set[LeaseKey]:
        """Record failed attempts: back to pending at the retry time, or dead.

        Fenced by lease token like :meth:`complete`; returns the (id, token)
        pairs applied, and only those append to the attempt history.
        """
        ...

    async def release(self, ids: Sequence[DeliveryId], lease_token: str) -> int:
        """Hand claimed deliveries back to pending without counting the attempt.

        They keep their place (run_at and, per key, event order), and waiting
        workers are woken as by a publish.
        """
        ...

    async def extend(
        self, ids: Sequence[DeliveryId], lease_token: str, lease_seconds: float
    ) -> set[DeliveryId]:
        """Renew leases still held under ``lease_token``; return the ids renewed."""
        ...

    async def recover_expired(self, limit: int = 1000) -> int:
        """Return deliveries whose lease ran out to pending (or dead when out of attempts).

        They keep their place, and waiting workers are woken as by a publish.
        """
        ...

    async def rescue(self, silent_seconds: float, limit: int = 1000) -> list[Rescue]:
        """Take back the processing deliveries of lost workers, before their leases run out.

        A worker is lost when its last heartbeat is older than
        ``silent_seconds`` by the database's clock (so clock skew between hosts
        does not matter), or when it reported from this host under a process
        id that no longer exists here. Its deliveries are recovered as an
        expired lease is (fenced: its results are refused from then on; the
        attempt counts; dead when out of attempts), the history says
        ``WorkerLost``, its row counts them, and waiting workers are woken.
        """
        ...

    async def next_run_in(self, subscription_id: int, after: Any = None) -> float | None:
        """Seconds until the subscription's next claimable delivery is due, or None.

        Only rows a claim could take count: for an ordered subscription, the
        heads of keys with nothing processing. None when there is none. With
        ``after`` (a claim cursor), rows behind it are left to the claim from
        the start that looks there; a backend without cursors ignores it.
        """
        ...

    upkeep_seconds: float | None
    """How often each worker offers to run :meth:`upkeep`; None when the store needs none."""

    async def upkeep(self) -> None:
        """Storage upkeep beside claiming, one process at a time (PostgreSQL's append-only ring:
        rotation and pruning of its slots). Safe to call from every worker at once."""
        ...

    async def worker_beat(
        self, worker_id: str, *, gone: bool = False, subscription_ids: Sequence[int] = ()
    ) -> None:
        """Record that a worker is alive (or, with ``gone``, that it stopped).

        A live worker also marks the ``subscription_ids`` it serves as seen by
        a worker now.
        """
        ...


class Wakeups(Protocol):
    """How a waiting worker learns that work may have arrived."""

    async def run(self) -> None:
        """Receive wake-ups from other processes until cancelled (a no-op loop where none exist)."""
        ...

    async def wait(self, timeout: float) -> set[str]:
        """Event types woken since the last call, or an empty set after ``timeout``.

        A wake-up is a hint, never a promise: the caller claims to find out.
        ``SWEEP`` in the set means every subscription.
        """
        ...

    def wake_local(self, event_types: set[str]) -> None:
        """Wake this process's waiting worker for ``event_types``."""
        ...

    def observe(self) -> ChangeFeed:
        """A new, separate feed of "something may have changed", for a watcher such as the dashboard.

        It has its own source (on PostgreSQL its own LISTEN connection, on
        SQLite its own look at the file's commit counter), so it never takes a
        wake-up from the worker's :meth:`wait`.
        """
        ...


class ChangeFeed(Protocol):
    """Hints that the bus's tables may have changed: new events, releases, replays, other writers' commits.

    A hint, never a promise, and not every write sends one (a delivery's
    completion does not, on PostgreSQL): a watcher also looks itself now and
    then.
    """

    @property
    def healthy(self) -> bool:
        """Whether the feed's source is up (its LISTEN connection, or its look at the file)."""
        ...

    async def run(self) -> None:
        """Keep the source alive until cancelled."""
        ...

    async def changed(self, timeout: float) -> bool:
        """True as soon as a hint arrived since the last call, False after ``timeout`` without one."""
        ...
