"""The bus: publish typed events, declare subscriptions, reach the backend."""

from __future__ import annotations

import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec
import orjson

from ._coalesce import PublishCoalescer
from ._deprecated import Moved
from ._priority import checked_priority
from .audit import Actor, Audit
from .backends import open_backend
from .backends.base import Backend, ChangeFeed, OutgoingEvent, SubscriptionSpec
from .errors import (
    ConfigurationError,
    EncodeError,
    InvalidKey,
    PayloadTooLarge,
    UnknownEventType,
)
from .event import (
    Event,
    check_event_type,
    check_upcasters,
    decode_event,
    encode_event,
    event_type_of,
    event_version_of,
)
from .logs import OutcomeLog
from .observe import CompositeHooks, Hooks
from .pull import Pull
from .retention import Pruner, PruneReport, Retention
from .router import Router
from .scheduling import Schedules
from .stuck import LOST_WORKER_SECONDS, act
from .throughput import ThroughputReader
from .types import (
    ChainEvent,
    DeliveryDetail,
    DeliveryFilter,
    DeliveryId,
    DeliveryRow,
    EventView,
    PublishResult,
    StatusReport,
    SubscriptionInfo,
    WorkerRow,
)
from .workflows import Machine, Workflows
from .workflows._commits import CommitQueue

__all__ = ["DEFAULT_DSN", "Bus", "Envelope"]

DEFAULT_DSN = "sqlite:///eventbus.db"
"""The database of a bus given no DSN and no ``$EVENTBUS_DSN``."""
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_DELAY_SECONDS = 100 * 365 * 86400.0  # beyond this a delay is a mistake, not a schedule
MAX_INSPECT_ROWS = 1000
MAX_FILTER_TEXT = 1000
"""The longest error or payload text a :class:`DeliveryFilter` may search for."""
_PAYLOAD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


class Envelope(msgspec.Struct, frozen=True):
    """An event with its publish options, for :meth:`Bus.publish_many`."""

    event: Event
    key: str | None = None
    delay: float | timedelta | None = None
    headers: dict[str, str] | None = None
    ordering_key: str | None = None
    once: bool = False
    """Keep the key for good, as ``publish(..., once=True)`` does."""
    priority: int = 0
    """Lower runs first within a subscription, as ``publish(..., priority=…)``."""


def _seconds(delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    value = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if value < 0:
        raise ConfigurationError("delay cannot be negative")
    if not math.isfinite(value) or value > MAX_DELAY_SECONDS:
        raise ConfigurationError(f"delay must be a finite number of seconds up to 100 years, got {value}")
    return value


def _checked_key(name: str, value: object) -> str | None:
    """A key or ordering key the database can store: a str, valid UTF-8, no NUL."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidKey(f"{name} must be a str, not {type(value).__name__}: {value!r}")
    if "\x00" in value:
        raise InvalidKey(f"{name} {value!r} contains a NUL character, which cannot be stored")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidKey(f"{name} {value!r} is not valid Unicode text ({exc.reason})") from exc
    return value


def _encoded_headers(headers: object) -> str:
    """Headers as the JSON object stored with the event; checked once, here."""
    if not headers:
        return "{}"
    if not isinstance(headers, dict):
        raise EncodeError(f"headers must be a dict of str to str, not {type(headers).__name__}")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise EncodeError(
                f"headers must map str to str; {name!r}: {value!r} is "
                f"{type(name).__name__}: {type(value).__name__}"
            )
        if "\x00" in name or "\x00" in value:
            raise EncodeError(f"header {name!r} contains a NUL character, which cannot be stored")
    try:
        return orjson.dumps(headers).decode()
    except orjson.JSONEncodeError as exc:
        raise EncodeError(f"cannot encode headers: {exc}") from exc


class Bus(Router):
    """A durable event bus.

    Beside publishing and its subscriptions, a bus holds three bundles:
    ``bus.workflows`` (:class:`~eventbus.workflows.Workflows`: the state
    machines it includes and their instances), ``bus.schedules``
    (:class:`~eventbus.scheduling.Schedules`: its schedules as recorded in the
    database) and ``bus.pull`` (:class:`~eventbus.pull.Pull`: subscriptions
    without a handler, whose deliveries code claims itself).

    :param dsn: ``postgresql://…`` for production, ``sqlite:///path`` for the
        embedded backend. Defaults to ``$EVENTBUS_DSN``, then ``./eventbus.db``.
    :param schema: PostgreSQL schema of the tables (``$EVENTBUS_SCHEMA``, then ``eventbus``).
    :param max_payload_bytes: publishes whose encoded payload and headers
        together exceed this raise :class:`PayloadTooLarge`.
    :param migrate: apply pending migrations when the bus opens. By default a
        bus on a missing or out-of-date schema raises :class:`SchemaNotMigrated`
        and changes nothing; run ``eventbus migrate`` or :meth:`migrate` first.
    :param hooks: :class:`~eventbus.observe.Hooks` told about publishes, claims,
        handler runs and outcomes (metrics, tracing, your own); more with :meth:`add_hooks`.
    :param retention: how long finished rows are kept (:class:`~eventbus.retention.Retention`).
    :param coalesce_publishes: concurrent :meth:`publish` calls of this bus
        (without ``connection``) share one statement and one commit; a call
        that finds none in flight is sent at once. Each caller still gets its
        own result or error. Off: one transaction per call.
    :param rollup: workers count each subscription's completed, failed and dead
        runs and their durations per minute and sample its queue once a minute,
        for ``bus.throughput(...)`` and the dashboard's charts (:mod:`eventbus.throughput`).
        Off: they do none of it.
    :param backend_options: passed to the backend. On PostgreSQL: ``pooler``
        (``"transaction"`` behind PgBouncer's transaction pooling or a managed
        pooler like it), ``pooler_prepared_statements``, ``listen_dsn``,
        ``poll_interval_seconds`` (also DSN options, see the Deploying guide),
        the pool sizes (``eventbus.backends.postgres.PostgresBackend``), and
        ``append_only=True``: ordinary deliveries are written as inserts only
        and their space returned by TRUNCATE and DROP (the Operating guide;
        :mod:`eventbus.backends.postgres.ring`).
        On both backends: ``priority_step_seconds`` (default 60), the seconds
        of waiting one priority level is worth: a delivery of priority ``p``
        sorts as if it were due ``p`` steps later, so it waits at most ``p``
        steps behind fresh work of priority 0. Give every process of a
        deployment the same step.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        backend: Backend | None = None,
        migrate: bool = False,
        hooks: Sequence[Hooks] = (),
        retention: Retention | None = None,
        coalesce_publishes: bool = True,
        rollup: bool = True,
        **backend_options: Any,
    ) -> None:
        super().__init__()
        if max_payload_bytes < 1:
            raise ConfigurationError(f"max_payload_bytes must be at least 1, got {max_payload_bytes}")
        self.outcome_log = OutcomeLog()
        self.hooks = CompositeHooks([self.outcome_log, *hooks])
        self.retention = retention or Retention()
        self.rollup = rollup
        """Whether this bus's workers keep the throughput rollup (:mod:`eventbus.throughput`)."""
        self.dsn = dsn or os.environ.get("EVENTBUS_DSN") or DEFAULT_DSN
        self.max_payload_bytes = max_payload_bytes
        self.backend: Backend = backend or open_backend(
            self.dsn, schema or os.environ.get("EVENTBUS_SCHEMA"), migrate=migrate, **backend_options
        )
        self.coalescer = (
            PublishCoalescer(
                lambda events: self.backend.deliveries.publish_serial(events),
                fallback=lambda events: self.backend.deliveries.publish(events),
            )
            if coalesce_publishes
            else None
        )
        store = self.backend.workflows
        self.workflows = Workflows(store, CommitQueue(store), router=self, register=self.register)
        """The state machines included in this bus and the operations on their instances."""
        self.schedules = Schedules(self.backend.schedules, self.declared_schedules)
        """This bus's schedules, as declared here and recorded in the database."""
        self.pull = Pull(
            self,
            lambda: self.backend.deliveries,
            self.register,
            self.outgoing,
            lambda: self.max_payload_bytes,
            self.delivery,
        )
        """Subscriptions without a handler, whose deliveries code claims itself (:mod:`eventbus.pull`)."""
        self.audit = Audit(lambda: self.backend.operate)
        """The trail of operator actions (:mod:`eventbus.audit`)."""
        self.throughput = ThroughputReader(lambda: self.backend.inspect)
        """``await bus.throughput(subscription=None, window="1h")``: runs, failures, backlog and
        handler durations per step (:mod:`eventbus.throughput`)."""

    async def __aenter__(self) -> Bus:
        await self.backend.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the bus: the batch of publishes in flight finishes, then the backend's connections close."""
        if self.coalescer is not None:
            await self.coalescer.aclose()
        await self.backend.aclose()

    async def migrate(self) -> list[str]:
        """Apply pending migrations; return the names of the files applied."""
        return await self.backend.schema.migrate()

    def include(self, router: Router | Machine[Any]) -> None:
        """Add a router's subscriptions and schedules, or a state machine (``bus.workflows.include``).

        Including another bus includes its subscriptions and its machines, run on this bus.
        """
        if isinstance(router, Machine):
            self.workflows.include(router)
            return
        if not isinstance(router, Bus):
            super().include(router)
            return
        steps = router.workflows.subscription_names()
        for sub in router.subscriptions.values():
            if sub.name not in steps:
                self.add(sub)
        for m in router.workflows.machines.values():
            self.workflows.include(m)

    def add_hooks(self, hooks: Hooks) -> None:
        """Add observability hooks (see :mod:`eventbus.observe`); workers started later use them."""
        self.hooks.add(hooks)

    # -- publishing -------------------------------------------------------

    def outgoing(
        self,
        event: Event,
        *,
        key: str | None = None,
        delay: float | timedelta | None = None,
        headers: dict[str, str] | None = None,
        ordering_key: str | None = None,
        correlation_id: int | None = None,
        causation_id: int | None = None,
        once: bool = False,
        priority: int = 0,
    ) -> OutgoingEvent:
        """Encode and check one event; raises a :class:`PublishError` subclass.

        Everything the database will be asked to store is checked here, at the
        caller (``publish`` or ``ctx.emit``): keys, headers and the size
        (and :class:`ConfigurationError` for ``once`` without a key,
        :class:`~eventbus.errors.InvalidPriority` for a priority outside 0 to 9).
        """
        if once and key is None:
            raise ConfigurationError("once=True keeps the event's key for good: give it a key=...")
        event_type = event_type_of(type(event))
        headers_json = _encoded_headers(headers)
        payload = self._checked_size(event_type, encode_event(event), headers_json)
        out = OutgoingEvent(
            event_type=event_type,
            payload=payload,
            key=_checked_key("key", key),
            headers_json=headers_json,
            delay_seconds=_seconds(delay),
            correlation_id=correlation_id,
            causation_id=causation_id,
            ordering_key=_checked_key("ordering_key", ordering_key),
            keep_key=once,
            event_version=event_version_of(type(event)),
            priority=checked_priority(priority),
        )
        return out if causation_id is None else self.hooks.on_outgoing(out)

    def _checked_size(self, event_type: str, payload: bytes, headers_json: str = "{}") -> bytes:
        """Payload and headers count toward ``max_payload_bytes`` together."""
        size = len(payload) + (len(headers_json.encode()) if headers_json != "{}" else 0)
        if size > self.max_payload_bytes:
            what = "payload is" if headers_json == "{}" else "payload and headers are"
            raise PayloadTooLarge(
                f"{event_type} {what} {size} bytes, over the limit of {self.max_payload_bytes}"
            )
        return payload

    async def publish(
        self,
        event: Event,
        *,
        key: str | None = None,
        delay: float | timedelta | None = None,
        headers: dict[str, str] | None = None,
        ordering_key: str | None = None,
        connection: Any = None,
        once: bool = False,
        priority: int = 0,
    ) -> PublishResult:
        """Append ``event`` to the log and fan it out to every subscription of its type.

        With ``key``, a second publish of the same type and key inserts nothing
        and returns the first event's id with ``duplicate=True``, for as long
        as the event is kept (at least the retention's ``dedup_window``). With
        ``once=True`` the key is kept for good, after the event is pruned: a
        later publish of it with ``once=True`` is a duplicate of the first
        event, ever. With ``connection`` (an asyncpg connection inside a
        transaction), the event exists only if that transaction commits.
        Concurrent calls without ``connection`` share a commit (see
        ``coalesce_publishes``).

        ``priority`` (0 to 9, default 0): lower runs first within each
        subscription, and each level is worth ``priority_step_seconds`` of
        waiting, so lower priorities are never starved (see the Priorities
        guide). A keyed delivery of an ordered subscription still waits for
        the earlier ones of its key.

        :raises ConfigurationError: ``once=True`` without a ``key``.
        :raises InvalidPriority: ``priority`` is not an int from 0 to 9.
        """
        out = self.outgoing(
            event, key=key, delay=delay, headers=headers, ordering_key=ordering_key, once=once,
            priority=priority,
        )  # fmt: skip
        (result,) = await self._publish([out], connection)
        return result

    async def publish_many(
        self, events: Iterable[Event | Envelope], *, connection: Any = None
    ) -> list[PublishResult]:
        """Publish a batch in one round trip; results are in input order."""
        batch = [
            self.outgoing(
                e.event,
                key=e.key,
                delay=e.delay,
                headers=e.headers,
                ordering_key=e.ordering_key,
                once=e.once,
                priority=e.priority,
            )
            if isinstance(e, Envelope)
            else self.outgoing(e)
            for e in events
        ]
        return await self._publish(batch, connection)

    async def _publish(self, batch: Sequence[OutgoingEvent], connection: Any) -> list[PublishResult]:
        """Publish through the hooks (trace context, metrics)."""
        batch, done = self.hooks.on_publish(batch)
        if done is None:
            return await self._publish_now(batch, connection)
        try:
            results = await self._publish_now(batch, connection)
        except BaseException as exc:
            done(None, exc)
            raise
        done(results, None)
        return results

    async def _publish_now(self, batch: Sequence[OutgoingEvent], connection: Any) -> list[PublishResult]:
        if connection is None:
            if self.coalescer is not None and len(batch) == 1:  # may share a commit with others
                return [await self.coalescer.publish(batch[0])]
            return await self.backend.deliveries.publish(batch)
        publish_in = getattr(self.backend.deliveries, "publish_in", None)
        if publish_in is None:
            raise ConfigurationError(
                "publish(connection=...) joins a caller's PostgreSQL transaction; the "
                f"{self.backend.kind} backend has no such connection: publish without it"
            )
        results: list[PublishResult] = await publish_in(connection, batch)
        return results

    async def publish_raw(
        self,
        event_type: str,
        payload: bytes,
        *,
        key: str | None = None,
        delay: float = 0.0,
        event_version: int | None = None,
    ) -> PublishResult:
        """Publish an already encoded JSON payload (used by the CLI).

        ``event_version`` is the version the payload is written in; by default,
        that of the class this bus knows for ``event_type`` (1 if none).
        """
        check_event_type(event_type)
        self._checked_size(event_type, payload)
        if event_version is None:
            cls = self._event_class(event_type)
            event_version = 1 if cls is None else event_version_of(cls)
        elif isinstance(event_version, bool) or not isinstance(event_version, int) or event_version < 1:
            raise ConfigurationError(f"event_version is an int of at least 1, got {event_version!r}")
        out = OutgoingEvent(
            event_type=event_type,
            payload=payload,
            key=_checked_key("key", key),
            delay_seconds=_seconds(delay),
            event_version=event_version,
        )
        (result,) = await self._publish([out], None)
        return result

    def _event_class(self, event_type: str) -> type[Event] | None:
        """The event class a subscription of this bus handles ``event_type`` with (None: no such)."""
        for sub in self.subscriptions.values():
            if sub.event_type == event_type:
                return sub.event_class
        return None

    def validate_payload(self, event_type: str, payload: bytes, event_version: int | None = None) -> Event:
        """Decode ``payload`` (stored at ``event_version``; None: the current one) with this bus's class.

        :raises UnknownEventType: no subscription of this bus handles ``event_type``.
        :raises DecodeError: the payload does not decode (or upcast) to the class.
        """
        cls = self._event_class(event_type)
        if cls is None:
            raise UnknownEventType(f"no subscription of this bus handles {event_type!r}")
        return decode_event(cls, payload, event_version)

    def decode(self, view: DeliveryDetail | EventView) -> Event:
        """The event of a delivery or an event read back (``delivery``, ``event``) as its current class.

        A payload stored at an older version runs through the class's
        upcasters, as a worker would run it.

        :raises UnknownEventType: no subscription of this bus handles its type.
        :raises DecodeError: the payload does not decode (:class:`MissingUpcaster`,
            :class:`FutureEventVersion` for a version the class cannot read).
        """
        return self.validate_payload(view.event_type, view.payload, view.event_version)

    # -- subscriptions ------------------------------------------------------

    def specs(self, names: Sequence[str] | None = None) -> list[SubscriptionSpec]:
        """The subscriptions of this bus (those in ``names``, if given) as the backend records them."""
        subs = [s for s in self.subscriptions.values() if names is None or s.name in names]
        for s in subs:  # upcasters declared after the subscription are checked here too
            check_upcasters(s.event_class)
        return [
            SubscriptionSpec(
                name=s.name,
                event_type=s.event_type,
                max_attempts=s.retry.max_attempts,
                lease_seconds=s.lease_seconds,
                ordered=s.ordered,
                start_from=s.start_from,
            )
            for s in subs
        ]

    async def register(self, names: Sequence[str] | None = None, *, served: bool = False) -> dict[str, int]:
        """Record this bus's subscriptions in the database; return their ids.

        A worker does this when it starts (with ``served``: it will serve
        them). Publishers that start first may call it so that their events
        fan out to subscriptions no worker has seen yet (a new subscription is
        also backfilled from the log by default).
        """
        return await self.backend.deliveries.register(self.specs(names), served=served)

    async def list_subscriptions(self) -> list[SubscriptionInfo]:
        """Every subscription the database knows (this bus's or not): state, last worker report, backlog."""
        return await self.backend.inspect.subscriptions()

    async def workers(self) -> list[WorkerRow]:
        """The workers that reported in, as :meth:`status` lists them, without the counts it reads."""
        return await self.backend.inspect.workers()

    async def subscription_names(self) -> list[str]:
        """The names of every subscription the database knows, in order (no backlog is counted)."""
        return await self.backend.inspect.subscription_names()

    async def pause_subscription(self, name: str, *, audit: Actor | None = None) -> bool:
        """Stop claims of ``name``; its deliveries keep accumulating. False if it was not active.

        ``audit``: who pauses it, recorded in the audit trail in the same transaction.
        """
        entry = None if audit is None else audit.entry("pause", f"subscription {name}")
        return await self.backend.operate.pause_subscription(name, entry)

    async def resume_subscription(self, name: str, *, audit: Actor | None = None) -> bool:
        """Serve a paused (or removed) subscription again. False if it was active.

        ``audit``: as for a pause.
        """
        entry = None if audit is None else audit.entry("resume", f"subscription {name}")
        return await self.backend.operate.resume_subscription(name, entry)

    async def remove_subscription(self, name: str, *, audit: Actor | None = None) -> int:
        """Stop fan-out to ``name`` and cancel its pending deliveries; return how many.

        For a subscription taken out of the code: a worker that registers it
        again does not bring it back (``resume_subscription`` does).
        ``audit``: as for a pause.
        """
        entry = None if audit is None else audit.entry("remove", f"subscription {name}")
        return await self.backend.operate.remove_subscription(name, entry)

    # -- operations ----------------------------------------------------------

    def changes(self) -> ChangeFeed:
        """A new feed of hints that the bus's tables may have changed, for a watcher such as the dashboard.

        Run its ``run()`` in a task and wait on ``changed(timeout)``. It has a
        source of its own (on PostgreSQL a LISTEN connection to ``listen_dsn``
        or the DSN, on SQLite a look at the file's commit counter), separate
        from the worker's wake-ups. Not every write is hinted: look yourself now and then.
        """
        return self.backend.wakeups.observe()

    async def status(self, *, window: int | None = None) -> StatusReport:
        """Counts, each subscription's queue, workers and (PostgreSQL) storage health.

        ``window``: count completed and cancelled deliveries among the newest
        ``window`` only, and events no further than ``window`` (see
        :attr:`StatusReport.window`), so the read stays bounded at millions of rows.
        """
        if window is not None and window < 1:
            raise ConfigurationError(f"window must be at least 1, got {window}")
        report = await self.backend.inspect.status(window)
        details = await self.backend.inspect.health(window)
        return msgspec.structs.replace(report, **msgspec.structs.asdict(details))

    async def trace(self, event_id: int, *, limit: int = 1000) -> ChainEvent:
        """The causation tree of ``event_id``'s chain, from its root, with every delivery.

        :class:`NotFound` if there is no such event (or it was pruned).
        """
        return chain_tree(await self.backend.inspect.chain(event_id, limit))

    async def prune(
        self,
        *,
        dry_run: bool = False,
        retention: Retention | None = None,
        progress: Callable[[PruneReport], object] | None = None,
    ) -> PruneReport:
        """Run retention now, to the end of what it may delete (see :mod:`eventbus.retention`)."""
        pruner = Pruner(self.backend.retention, retention or self.retention)
        return await pruner.run(dry_run=dry_run, max_batches=1 << 40, progress=progress)

    async def dead_letters(
        self,
        *,
        subscription: str | None = None,
        event_type: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
        error_contains: str | None = None,
        payload_contains: str | None = None,
    ) -> list[DeliveryRow]:
        """The oldest ``limit`` dead deliveries matching, oldest first (one id walk, one page read)."""
        if limit < 1:
            raise ConfigurationError(f"limit must be at least 1, got {limit}")
        flt = _checked_filter(DeliveryFilter(
            status="dead", subscription=subscription, event_type=event_type, since=since,
            error_contains=error_contains, payload_contains=payload_contains,
        ))  # fmt: skip
        ids = await self.backend.inspect.delivery_ids(flt, limit, listing=True)
        rows: list[DeliveryRow] = []
        for start in range(0, len(ids), MAX_INSPECT_ROWS):
            page = ids[start : start + MAX_INSPECT_ROWS]
            rows += await self.backend.inspect.find(DeliveryFilter(ids=page), len(page))
        return sorted(rows, key=lambda r: r.id)

    async def delivery(self, delivery_id: int) -> DeliveryDetail:
        """One delivery with its payload, headers and every failed attempt."""
        return await self.backend.inspect.show(delivery_id)

    async def find_deliveries(
        self,
        flt: DeliveryFilter | None = None,
        *,
        limit: int = 50,
        before_id: int | None = None,
        after_id: int | None = None,
    ) -> list[DeliveryRow]:
        """Deliveries matching ``flt``, newest first; ``before_id``: the last id of the previous page.

        ``after_id`` instead gives the ``limit`` deliveries just above it (the
        page before, going back up a list), still newest first.
        """
        flt, limit = _checked_filter(flt), _checked_limit(limit)
        if after_id is None:
            return await self.backend.inspect.find(flt, limit, before_id)
        if before_id is not None:
            raise ConfigurationError("give before_id or after_id, not both")
        ids = await self.backend.inspect.delivery_ids(flt, limit, after_id)
        return await self.backend.inspect.find(DeliveryFilter(ids=ids), limit) if ids else []

    async def count_deliveries(self, flt: DeliveryFilter | None = None, *, cap: int = 10_000) -> int:
        """How many deliveries match ``flt``; a result above ``cap`` means "more than cap"."""
        if cap < 1:
            raise ConfigurationError(f"cap must be at least 1, got {cap}")
        return await self.backend.inspect.count(_checked_filter(flt), cap)

    async def event(self, event_id: int) -> EventView:
        """One event with its payload, headers and every delivery with its attempt history."""
        return await self.backend.inspect.event(event_id)

    async def dead_id_batches(
        self, flt: DeliveryFilter, batch_size: int = 1000
    ) -> AsyncIterator[list[DeliveryId]]:
        """The ids of dead deliveries matching ``flt``, in id order, one batch at a time.

        ``flt.status`` is taken to be "dead" whatever it says. Named ids alone
        are batched as given (the guarded statements skip rows no longer
        dead); filters are walked by id, so a walk that changes rows as it
        goes never sees one twice.
        """
        flt = _checked_filter(msgspec.structs.replace(flt, status="dead"))
        if flt.ids is not None and flt == DeliveryFilter(status="dead", ids=flt.ids):
            ids = sorted(set(flt.ids))
            for start in range(0, len(ids), batch_size):
                yield [DeliveryId(i) for i in ids[start : start + batch_size]]
            return
        after = 0
        while batch := await self.backend.inspect.delivery_ids(flt, batch_size, after):
            yield batch
            after = batch[-1]

    async def replay(
        self, flt: DeliveryFilter, batch_size: int = 1000, progress: Callable[[int], object] | None = None
    ) -> int:
        """Move matching dead deliveries back to pending; return how many moved."""
        return await self._each_dead_batch(flt, batch_size, self.backend.operate.replay, progress)

    async def purge(
        self, flt: DeliveryFilter, batch_size: int = 1000, progress: Callable[[int], object] | None = None
    ) -> int:
        """Delete matching dead deliveries and their history; return how many."""
        return await self._each_dead_batch(flt, batch_size, self.backend.operate.purge, progress)

    async def _each_dead_batch(
        self,
        flt: DeliveryFilter,
        batch_size: int,
        apply: Callable[[Sequence[int]], Awaitable[int]],
        progress: Callable[[int], object] | None,
    ) -> int:
        total = 0
        async for ids in self.dead_id_batches(flt, batch_size):
            total += await apply(ids)
            if progress is not None:
                progress(total)
        return total

    async def cancel(
        self,
        ids: Sequence[int] | DeliveryFilter,
        *,
        audit: Actor | None = None,
        stuck: bool = False,
        lost_after_seconds: float = LOST_WORKER_SECONDS,
    ) -> int:
        """Cancel pending deliveries by id (guarded: others are left alone); return how many.

        ``ids`` may be a :class:`DeliveryFilter`: everything matching is walked
        in id batches. With ``stuck=True``, stuck processing deliveries (see
        :meth:`release_stuck`) are cancelled too; the worker that may still
        finish the run loses on its lease token. ``audit``: who cancels them,
        recorded in the audit trail in the same transaction (after the walk,
        for a filter).
        """
        target = _target(ids)
        return await act(
            self.backend, "cancel", target, audit=audit, stuck=stuck, lost_after_seconds=lost_after_seconds
        )

    async def retry_now(self, ids: Sequence[int] | DeliveryFilter, *, audit: Actor | None = None) -> int:
        """Make pending deliveries waiting out a backoff (or a delay) due now; return how many moved.

        Guarded: only deliveries still pending with a future run_at move. The
        claim order moves with run_at, so priorities keep their meaning, and
        the workers are woken. ``ids`` may be a :class:`DeliveryFilter`
        (``condition="retrying"``: those waiting after a failure). ``audit``:
        as for :meth:`cancel`. See :mod:`eventbus.stuck`.
        """
        return await act(self.backend, "retry", _target(ids), audit=audit)

    async def release_stuck(
        self,
        ids: Sequence[int] | DeliveryFilter,
        *,
        audit: Actor | None = None,
        lost_after_seconds: float = LOST_WORKER_SECONDS,
    ) -> int:
        """Release stuck deliveries as a lease recovery would; return how many moved.

        Stuck: processing with its lease run out, or held by a lost worker (no
        heartbeat for ``lost_after_seconds``). The attempt counts: back to
        pending, or dead when it was the last; a worker that still finishes
        the run is refused (its lease token no longer matches). A delivery
        under a live lease of a live worker is left alone. ``ids`` may be a
        :class:`DeliveryFilter` (``condition="stuck"``). ``audit``: as for
        :meth:`cancel`. See :mod:`eventbus.stuck` for why the attempt counts.
        """
        target = _target(ids)
        return await act(self.backend, "release", target, audit=audit, lost_after_seconds=lost_after_seconds)

    # -- spellings of the previous release ---------------------------------------

    start = Moved("workflows")
    instance = Moved("workflows")
    instances = Moved("workflows")
    history = Moved("workflows")
    signals = Moved("workflows")
    approvals = Moved("workflows")
    workflow_counts = Moved("workflows", "counts")
    signal = Moved("workflows")
    approve = Moved("workflows")
    deny = Moved("workflows")
    repoint = Moved("workflows")
    cancel_instance = Moved("workflows", "cancel")
    pause = Moved("workflows")
    resume = Moved("workflows")
    resolve = Moved("workflows")
    sweep_workflows = Moved("workflows", "sweep")
    workflow_check = Moved("workflows", "check")
    machine = Moved("workflows")
    machines = Moved("workflows")
    workflow_commits = Moved("workflows", "commits")
    schedule_planner = Moved("schedules", "planner")
    declare_schedules = Moved("schedules", "declare")
    tick_schedules = Moved("schedules", "tick")
    list_schedules = Moved("schedules", "list")
    schedule_info = Moved("schedules", "info")
    occurrences = Moved("schedules")
    pause_schedule = Moved("schedules", "pause")
    resume_schedule = Moved("schedules", "resume")
    remove_schedule = Moved("schedules", "remove")
    trigger_schedule = Moved("schedules", "trigger")
    backfill_schedule = Moved("schedules", "backfill")


def chain_tree(flat: Sequence[ChainEvent]) -> ChainEvent:
    """Nest a flat chain (oldest first) by causation; an orphan (its cause pruned) hangs off the root.

    Built bottom-up (an event is always newer than its cause), so a long
    chain needs no recursion.
    """
    root = flat[0]
    known = {e.id for e in flat}
    children: dict[int, list[ChainEvent]] = {}
    built: dict[int, ChainEvent] = {}
    for e in reversed(flat):
        node = msgspec.structs.replace(e, children=children.pop(e.id, [])[::-1])
        built[e.id] = node
        if e.id != root.id:
            parent = e.causation_id if e.causation_id in known else root.id
            children.setdefault(parent, []).append(node)
    return built[root.id]


def _checked_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_INSPECT_ROWS:
        raise ConfigurationError(f"limit must be between 1 and {MAX_INSPECT_ROWS}, got {limit}")
    return limit


def _target(ids: Sequence[int] | DeliveryFilter) -> Sequence[int] | DeliveryFilter:
    """Ids as given, or a filter checked as every read checks it."""
    return _checked_filter(ids) if isinstance(ids, DeliveryFilter) else ids


def _checked_filter(flt: DeliveryFilter | None) -> DeliveryFilter:
    flt = flt or DeliveryFilter()
    if flt.payload_path is not None and not _PAYLOAD_PATH.match(flt.payload_path):
        raise ConfigurationError(
            f"payload path {flt.payload_path!r}: use field names joined by dots, like customer.id"
        )
    implied = {"stuck": "processing", "retrying": "pending"}
    if flt.condition is not None and flt.condition not in implied:
        raise ConfigurationError(f"condition must be stuck or retrying, got {flt.condition!r}")
    if flt.condition is not None and flt.status not in (None, implied[flt.condition]):
        raise ConfigurationError(
            f"condition {flt.condition!r} is within status {implied[flt.condition]!r}, not {flt.status!r}"
        )
    if (flt.payload_path is None) != (flt.payload_value is None):
        raise ConfigurationError("a payload filter needs both a path and a value")
    texts = (flt.error_contains, flt.payload_contains, flt.message_pattern)
    if any(t is not None and len(t) > MAX_FILTER_TEXT for t in texts):
        raise ConfigurationError(f"an error or payload filter is at most {MAX_FILTER_TEXT} characters")
    return flt
