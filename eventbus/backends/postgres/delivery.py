"""The delivery port on PostgreSQL: SKIP LOCKED claims, token-fenced results, NOTIFY wake-ups."""

from __future__ import annotations

import datetime
import os
import socket
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import asyncpg

from ..._priority import MAX_PRIORITY
from ...errors import RegistrationError
from ...types import DeliveryId, PublishResult
from .._spacing import Spaced
from .._workers import lost_workers, rescues_of
from ..ports import (
    ClaimedDelivery,
    Completion,
    Failure,
    HandlerTransaction,
    LeaseKey,
    LockWaitExceeded,
    OutgoingEvent,
    Rescue,
    SubscriptionSpec,
    decode_headers,
    warn_not_active,
)
from ._db import PgDb, translate_errors
from ._transaction import handler_transaction
from .ring import UPKEEP_SECONDS, PgRing, evict
from .wakeups import PgWakeups
from .workflows import start_on

__all__ = ["PgDeliveries"]

# Backfills owed at registration are finished inline when the transactions
# that overlapped it end this soon; housekeeping finishes the others.
_INLINE_BACKFILL_SECONDS = 2.0
# The lease sweep from the start (see recover_expired) runs at least this often,
# spaced by its cost; the windowed sweep starts _SWEEP_OVERLAP before where the
# previous one ended.
_FULL_SWEEP_EVERY = 60.0
_SWEEP_OVERLAP = datetime.timedelta(seconds=2)


def _claimed(
    rows: Sequence[asyncpg.Record], subscription_id: int, token: str, cursor: bool | None = None
) -> list[ClaimedDelivery]:
    """Claimed rows as deliveries, written out by hand: this runs for every delivery.

    The rows are unpacked by position (a quarter of the time of a lookup by
    name per column): the columns of claim, claim_after and claim_ordered, in
    their order (ring_claim's too, its last column the slot). ``cursor``: the
    position is the claim order's (None), the ring's delivery id (True) or
    none (False: a claim from ``deliveries`` beside the ring, always from the start).
    """
    out = []
    for (
        id_, event_id, attempts, event_type, payload, headers, key, correlation_id, ordering_key,
        created_at, run_at, causation_id, version, priority, place,
    ) in rows:  # fmt: skip
        out.append(
            ClaimedDelivery(
                id=id_,
                event_id=event_id,
                subscription_id=subscription_id,
                attempts=attempts,
                lease_token=token,
                event_type=event_type,
                payload=payload,
                headers=decode_headers(headers),
                key=key,
                correlation_id=correlation_id,
                ordering_key=ordering_key,
                created_at=created_at,
                position=(place, run_at, id_) if cursor is None else (id_,) if cursor else None,
                run_at=run_at,
                causation_id=causation_id,
                event_version=version,
                priority=priority,
            )
        )
    return out


class PgDeliveries:
    """:class:`~eventbus.backends.ports.DeliveryStore` on PostgreSQL (the contract is there)."""

    def __init__(self, db: PgDb, wakeups: PgWakeups) -> None:
        self.db = db
        self.q = db.q
        self._wakeups = wakeups  # its health goes into each worker beat
        self._swept_to: datetime.datetime | None = None  # see recover_expired
        self._full_sweep = Spaced(_FULL_SWEEP_EVERY)
        self.ring: PgRing | None = PgRing(db) if db.append_only else None
        """The append-only hot path, when the bus takes it (see :mod:`.ring`)."""
        self.upkeep_seconds: float | None = UPKEEP_SECONDS if self.ring is not None else None

    # -- publish -------------------------------------------------------------

    async def publish(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Append and fan out atomically (see ``DeliveryStore.publish``)."""
        if not events:
            return []
        if len(events) == 1 and not self.db.held_busy:  # one event: the held connection is free
            try:
                return await self.publish_serial(events)
            except LockWaitExceeded:  # its key is held: wait for it off the held connection
                pass
        return await self._publish_pooled(events)

    async def _publish_pooled(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        async with self.db.conn("publish") as conn:
            return await self.db.publish_on(conn, events)

    async def publish_serial(self, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Publish on the connection held for the coalescer, which sends one batch at a time.

        It saves a pool acquire and release, a third of a lone publish's
        client time (see :meth:`PgDb.held`). A row lock is waited for at most
        ``HELD_LOCK_WAIT_MS``, then :class:`LockWaitExceeded` is raised.
        """
        if not events:
            return []
        if not self.db.holds_one:
            return await self._publish_pooled(events)
        async with self.db.held("publish") as conn:
            return await self.db.publish_on(conn, events, bounded=True)

    async def publish_in(self, connection: Any, events: Sequence[OutgoingEvent]) -> list[PublishResult]:
        """Publish on the caller's asyncpg connection: the events exist only if its transaction commits."""
        if not events:
            return []
        with translate_errors("publish", self.db.command_timeout):
            return await self.db.publish_on(connection, events)

    # -- subscriptions ---------------------------------------------------------

    async def register(self, specs: Sequence[SubscriptionSpec], *, served: bool = False) -> dict[str, int]:
        """Create or update subscriptions, backfilling new ones (see ``DeliveryStore.register``)."""
        ids: dict[str, int] = {}
        owed: list[int] = []
        async with self.db.tx("register") as conn:
            for spec in specs:
                ids[spec.name] = await self._register_one(conn, spec, served, owed)
        if owed:
            await self._finish_backfills_soon(owed, _INLINE_BACKFILL_SECONDS)
        else:
            await self.finish_backfills()  # what an earlier registration left owed
        return ids

    async def _register_one(self, conn: Any, spec: SubscriptionSpec, served: bool, owed: list[int]) -> int:
        """Record one subscription; a new one from the earliest event is backfilled and owed."""
        row = await conn.fetchrow(
            self.q["register"],
            spec.name,
            spec.event_type,
            spec.max_attempts,
            spec.lease_seconds,
            spec.ordered,
            served,
        )
        if row is None:
            raise RegistrationError(
                f"subscription {spec.name!r} is already bound to another event type; "
                "pick a new name for a new event type"
            )
        if served and row["state"] != "active":
            warn_not_active(spec.name, row["state"])
        if not row["created"] and row["was_ordered"] != spec.ordered:
            await evict(conn, self.db, row["id"])  # the ring holds no ordered deliveries
            await conn.execute(self.q["rekey"], row["id"], spec.ordered)
        if row["created"] and spec.start_from == "earliest":
            await conn.execute(self.q["backfill_guard"], self.db.channel)
            await conn.execute(self.q["backfill"], row["id"], self.db.priority_step)
            await conn.execute(self.q["backfill_owed"], row["id"])
            owed.append(row["id"])
        return int(row["id"])

    async def _finish_backfills_soon(self, owed: list[int], seconds: float) -> None:
        """Finish the backfills ``owed`` if their overlapping transactions end within ``seconds``.

        The backfill in the registering transaction saw every event committed
        before it; what it could not see is left to :meth:`finish_backfills`.
        """
        with anyio.move_on_after(seconds):
            while True:
                await self.finish_backfills()
                async with self.db.conn("finishing backfills") as conn:
                    if not await conn.fetchval(self.q["backfills_exist"], owed):
                        return
                await anyio.sleep(0.02)

    async def finish_backfills(self) -> int:
        """Complete owed backfills that nothing overlaps any more (see ``DeliveryStore``)."""
        async with self.db.conn("finishing backfills") as conn:
            if not await conn.fetchval(self.q["backfills_exist"], None):
                return 0
            await conn.execute(self.q["backfill_sessions"])
            finished = 0
            for row in await conn.fetch(self.q["backfills_settled"]):
                async with conn.transaction():
                    if await conn.fetchval(self.q["backfill_settle"], row["subscription_id"]) is not None:
                        await conn.execute(self.q["backfill_guard"], self.db.channel)
                        await conn.execute(self.q["backfill"], row["subscription_id"], self.db.priority_step)
                        finished += 1
        return finished

    # -- the delivery state machine -----------------------------------------------

    async def claim(
        self,
        subscription_id: int,
        limit: int,
        lease_seconds: float,
        worker_id: str,
        ordered: bool = False,
        after: Any = None,
    ) -> list[ClaimedDelivery]:
        """Lease up to ``limit`` runnable deliveries under one new token (see ``DeliveryStore.claim``)."""
        token = uuid.uuid4()
        widest = MAX_PRIORITY * self.db.priority_step  # no row sorts later than this past its time
        args: tuple[Any, ...] = (subscription_id, limit, lease_seconds, token, uuid.UUID(worker_id), widest)
        if self.ring is not None and not ordered:
            return await self._claim_both(args, after)
        if ordered:
            query = self.q["claim_ordered"]
        elif after is not None:
            query, args = self.q["claim_after"], (*args, *after)
        else:
            query = self.q["claim"]
        async with self.db.conn("claim") as conn:
            try:
                rows = await conn.fetch(query, *args)
            except asyncpg.exceptions.UniqueViolationError:
                if not ordered:
                    raise
                # A replay revived a key's head while another worker claimed a
                # later row of the key: the index refused one of the two.
                return []
        return _claimed(rows, subscription_id, str(token))

    async def _claim_both(self, args: tuple[Any, ...], after: Any) -> list[ClaimedDelivery]:
        """With the ring: what is due in ``deliveries`` (retries, spilled backlogs, prioritised
        deliveries) and placed before the ring's next row, from the start; then the ring from
        the cursor (a delivery id: the ring's rows are all due when published, in id order);
        then, if the ring ran dry, the rest of what is due in ``deliveries``. Only ring rows
        carry a cursor position. A look at ``deliveries`` that found no more work placed before
        the ring is not made again for :data:`~.ring.QUEUE_LOOK_SECONDS` (two statements per
        claim instead of three in the steady state)."""
        assert self.ring is not None
        subscription_id, limit, lease_seconds, token, worker, _ = args
        cursor = 0 if after is None else after[0]
        ring: list[Any] | None = None
        out: list[ClaimedDelivery] = []
        async with self.db.conn("claim") as conn:
            if self.ring.queue_due(subscription_id):
                rows = await self.ring.claim_queue(conn, args, cursor)
                out = _claimed(rows, subscription_id, str(token), cursor=False)
                self.ring.queue_looked(subscription_id, found_all=len(out) == limit)
            if len(out) < limit:
                ring = await self.ring.claim(
                    conn, subscription_id, limit - len(out), lease_seconds, token, worker, cursor
                )
                out += _claimed(ring, subscription_id, str(token), cursor=True)
            if len(out) < limit and ring is not None:  # the ring ran dry: what deliveries has placed after it
                rows = await conn.fetch(self.q["claim"], subscription_id, limit - len(out), *args[2:])
                out += _claimed(rows, subscription_id, str(token), cursor=False)
        return out

    async def complete(self, completions: Sequence[Completion]) -> set[LeaseKey]:
        """Mark completed, insert follow-ups and start runs, in one transaction, for owned rows only.

        Follow-ups and starts are kept by (delivery, token): a stale run of a
        delivery whose fresh run completes in the same batch adds none.
        """
        if not completions:
            return set()
        token = completions[0].lease_token
        if all(c.lease_token == token and not c.follow_ups and not c.starts for c in completions):
            # One statement (a claim batch's results, nothing to insert): atomic on its own,
            # without the two round trips of a transaction's BEGIN and COMMIT.
            async with self.db.conn("complete") as conn:
                return await self._complete_ids(conn, [c.delivery_id for c in completions], token)
        async with self.db.tx("complete") as conn:
            return await self.complete_on(conn, completions)

    async def _complete_ids(self, conn: Any, ids: list[DeliveryId], token: str) -> set[LeaseKey]:
        """Complete ``ids`` held under ``token``: ring claims by an outcome row, the others (and
        ring claims moved into ``deliveries`` meanwhile) by the guarded update."""
        if self.ring is None:
            rows = await conn.fetch(self.q["complete"], ids, token)
            return {(r[0], token) for r in rows}  # r[0]: the id
        done: set[DeliveryId] = set()
        ring, ids = self.ring.split(ids)
        if ring:
            done = await self.ring.complete(conn, ring, token)
            self.ring.forget(ring)
            ids += [i for i in ring if i not in done]  # moved meanwhile
        if ids:
            done.update(r[0] for r in await conn.fetch(self.q["complete"], ids, token))
            rest = [i for i in ids if i not in done]
            if rest:  # claimed in the ring by another process (a pull consumer's ids)
                found = await self.ring.complete_anywhere(conn, rest, token)
                done.update(found)
                # Not in the ring either: moved into deliveries after the update above read it
                # (a prune, an operator's action; the move commits both at once), or stale.
                moved = [i for i in rest if i not in found]
                if moved:
                    done.update(r[0] for r in await conn.fetch(self.q["complete"], moved, token))
        return {(i, token) for i in done}

    async def complete_on(self, conn: Any, completions: Sequence[Completion]) -> set[LeaseKey]:
        """:meth:`complete`'s writes on ``conn``, in the transaction the caller holds open."""
        by_token: dict[str, list[DeliveryId]] = {}
        for c in completions:
            by_token.setdefault(c.lease_token, []).append(c.delivery_id)
        done: set[LeaseKey] = set()
        for token, ids in by_token.items():
            done.update(await self._complete_ids(conn, ids, token))
        follow_ups = [e for c in completions if c.follow_ups and c.lease in done for e in c.follow_ups]
        if follow_ups:
            await self.db.publish_on(conn, follow_ups)
        for start in (s for c in completions if c.starts and c.lease in done for s in c.starts):
            await start_on(self.db, conn, start)
        return done

    def transaction(self, timeout_seconds: float) -> AbstractAsyncContextManager[HandlerTransaction]:
        """A pooled connection in a transaction for one transactional handler (see ``DeliveryStore``)."""
        return handler_transaction(self, timeout_seconds)

    async def fail(self, failures: Sequence[Failure]) -> set[LeaseKey]:
        """Record failed attempts, fenced by lease token (see ``DeliveryStore.fail``)."""
        if not failures:
            return set()
        f = failures
        async with self.db.conn("fail") as conn:
            if self.ring is not None:  # ring claims first move into deliveries, where retries live
                for token in {x.lease_token for x in f}:
                    await self.ring.move_ids(
                        conn, [x.delivery_id for x in f if x.lease_token == token], token
                    )
            rows = await conn.fetch(
                self.q["fail"],
                [x.delivery_id for x in f],
                [x.lease_token for x in f],
                [x.dead for x in f],
                [x.retry_delay_seconds for x in f],
                [x.error_type for x in f],
                [x.message for x in f],
                [x.traceback for x in f],
                [x.duration_seconds for x in f],
                [x.worker_id for x in f],
                self.db.channel,
            )
        return {(DeliveryId(r["id"]), r["token"]) for r in rows}

    async def release(self, ids: Sequence[DeliveryId], lease_token: str) -> int:
        """Hand claimed deliveries back to pending, uncounted (see ``DeliveryStore.release``)."""
        if not ids:
            return 0
        async with self.db.conn("release") as conn:
            if self.ring is not None:
                await self.ring.move_ids(conn, ids, lease_token)
            row = await conn.fetchrow(self.q["release"], list(ids), lease_token, self.db.channel)
        return int(row["released"])

    async def extend(
        self, ids: Sequence[DeliveryId], lease_token: str, lease_seconds: float
    ) -> set[DeliveryId]:
        """Renew the leases still held under ``lease_token``; return the ids renewed.

        With the ring, a claim younger than a third of its lease needs no renewal
        yet (the next comes before its lease ends): it is only read; an older one moves into
        ``deliveries`` and is renewed there from then on: a long handler's
        renewals update a row, a short handler's claim is never touched.
        """
        kept: set[DeliveryId] = set()
        async with self.db.conn("lease renewal") as conn:
            if self.ring is not None:
                young = self.ring.young(ids, lease_seconds)
                if young:  # read, not written: still held in the ring, or moved out of it?
                    kept.update(await self.ring.still_held(conn, young, lease_token))
                ids = [i for i in ids if i not in kept]
                if ids:
                    await self.ring.move_ids(conn, ids, lease_token)
            if ids:
                rows = await conn.fetch(self.q["extend"], list(ids), lease_token, lease_seconds)
                kept.update(DeliveryId(r["id"]) for r in rows)
        return kept

    async def recover_expired(self, limit: int = 1000) -> int:
        """Sweep from where the last sweep left off, and from the start now and then.

        Every finished delivery leaves an entry in ``deliveries_lease_until``
        that only vacuum removes; while a long transaction holds back the
        xmin horizon none is removed, and a sweep from the start would walk
        them all every second. An expired lease whose row another session
        holds (a dead client's open transaction, until the server ends it) is
        skipped, and the window then starts no later than it, so it is taken
        as soon as it is free. The sweep from the start, made first and then
        spaced by its cost, covers anything else behind the window.
        """
        started = time.monotonic()
        floor = self._swept_to if started < self._full_sweep.due_at else None
        async with self.db.conn("lease recovery") as conn:
            if self.ring is not None and await self.ring.move(
                conn, await self.ring.live(conn), expired=True, limit=limit
            ):
                floor = None  # their leases ended before this sweep's window: sweep from the start
            row = await conn.fetchrow(self.q["recover_expired"], limit, self.db.channel, floor)
        ended = time.monotonic()
        if floor is None:
            self._full_sweep.ran(started, ended)
        if row["expired"] < limit:  # else more are left past this sweep's end: start there again
            self._swept_to = row["swept_at"] - _SWEEP_OVERLAP
        return int(row["recovered"])

    async def rescue(self, silent_seconds: float, limit: int = 1000) -> list[Rescue]:
        """Take back the processing deliveries of lost workers (see ``DeliveryStore.rescue``)."""
        host = socket.gethostname()
        async with self.db.conn("worker rescue") as conn:
            if self.ring is not None:  # a lost worker's ring claims move first, then go as the rest
                await self.ring.move_lost(conn, silent_seconds, host)
            candidates = await conn.fetch(self.q["lost_worker_candidates"], silent_seconds, host)
            lost = lost_workers(candidates, silent_seconds, host)
            if not lost:
                return []
            ids = [uuid.UUID(i) for i in lost]
            taken = await conn.fetch(self.q["rescue"], ids, limit, self.db.channel)
        return rescues_of(lost, {r["worker_id"]: r["n"] for r in taken})

    async def next_run_in(self, subscription_id: int, after: Any = None) -> float | None:
        """Seconds until the next claimable delivery is due, or None (see ``DeliveryStore``)."""
        since = None if after is None or self.ring is not None else after[1]  # the cursor's run_at
        async with self.db.conn("next_run_in") as conn:
            if self.ring is not None and await self.ring.waiting(conn, subscription_id):
                return 0.0
            value = await conn.fetchval(self.q["next_run_in"], subscription_id, since)
        return None if value is None else float(value)

    async def upkeep(self) -> None:
        """The ring's upkeep turn (see :mod:`.ring`); nothing without the ring."""
        if self.ring is not None:
            await self.ring.upkeep()

    async def worker_beat(
        self, worker_id: str, *, gone: bool = False, subscription_ids: Sequence[int] = ()
    ) -> None:
        """Record that a worker is alive, with its listener's health, or that it stopped."""
        async with self.db.conn("worker heartbeat") as conn:
            if gone:
                await conn.execute(self.q["worker_gone"], uuid.UUID(worker_id))
                return
            await conn.execute(
                self.q["worker_beat"],
                uuid.UUID(worker_id),
                socket.gethostname(),
                os.getpid(),
                self._wakeups.healthy,
                self._wakeups.reconnects,
            )
            if subscription_ids:
                await conn.execute(self.q["subscriptions_seen"], list(subscription_ids))
