"""A model of the delivery contract: what every backend must do, in plain Python.

Each (event, subscription) delivery is a :class:`Delivery` whose status,
attempts, lease token and failure count the model moves exactly as the
contract says (``eventbus/backends/ports/``): a claim takes what
:meth:`Model.claimable` lists, a result is applied only under the token of
the delivery's current claim, a recovered or settled claim's token is stale
for good, a replay starts a dead delivery over, a prune deletes what
:meth:`Model.prunable` lists. The operator's actions (``eventbus.stuck``): a
retry now makes a waiting delivery due, a release of a stuck one (see
:meth:`Model.stuck`) moves it as a lease recovery does, a cancel with
``stuck`` ends it cancelled; both clear its claim's token. The state machine
in ``test_delivery_machine.py`` does each step on a real backend and on this
model and compares them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Delivery", "Model", "PublishedEvent", "Sub"]


@dataclass(frozen=True)
class Sub:
    """A subscription of the machine: its id, whether it is FIFO per key, its attempt budget."""

    name: str
    id: int
    ordered: bool
    max_attempts: int


@dataclass
class PublishedEvent:
    id: int
    key: str | None
    ordering_key: str | None
    delayed: bool = False
    """Published with a delay that outlasts the run: pending but never due."""


@dataclass
class Delivery:
    id: int
    event_id: int
    sub: Sub
    ordering_key: str | None
    """The event's ordering key on an ordered subscription, else None (what orders claims)."""
    status: str = "pending"
    attempts: int = 0
    token: str | None = None
    worker: str | None = None
    """The worker of its current claim (None when not processing)."""
    short_lease: bool = False
    """Its current lease runs out at once (the machine's way to let a lease expire)."""
    due: bool = True
    """Its run time has come (False: delayed, or retried later, past the end of the run)."""
    replays: int = 0
    failures: int = 0
    """Rows of its attempt history: failed attempts and expired leases."""


@dataclass
class Model:
    subs: tuple[Sub, ...]
    events: dict[int, PublishedEvent] = field(default_factory=dict)
    deliveries: dict[int, Delivery] = field(default_factory=dict)
    stale: list[tuple[int, str]] = field(default_factory=list)
    """(delivery id, token) of claims that no longer hold: never again applied."""

    # -- reading the model -------------------------------------------------------

    def owner_of(self, key: str) -> int | None:
        """The kept event that holds ``key`` (a publish of it is a duplicate of that event)."""
        return next((e.id for e in self.events.values() if e.key == key), None)

    def in_status(self, *statuses: str) -> list[Delivery]:
        return sorted((d for d in self.deliveries.values() if d.status in statuses), key=lambda d: d.id)

    def claimable(self, sub: Sub) -> set[int]:
        """The deliveries a claim on ``sub`` may take: pending ones that are due, and on an
        ordered subscription only the head of its key (a head not due yet blocks its key)
        while nothing of the key is processing."""
        mine = [d for d in self.deliveries.values() if d.sub == sub]
        return {d.id for d in mine if d.status == "pending" and d.due and self._is_head(d, mine)}

    def next_due(self, sub: Sub) -> bool | None:
        """What ``next_run_in`` must say of ``sub``: None when no pending delivery could be
        claimed once due (every key busy or nothing pending), else whether one is due now."""
        mine = [d for d in self.deliveries.values() if d.sub == sub]
        heads = [d for d in mine if d.status == "pending" and self._is_head(d, mine)]
        return any(d.due for d in heads) if heads else None

    @staticmethod
    def _is_head(d: Delivery, mine: list[Delivery]) -> bool:
        if d.ordering_key is None:
            return True
        same_key = [o for o in mine if o.ordering_key == d.ordering_key and o.id != d.id]
        busy = any(o.status == "processing" for o in same_key)
        earlier = any(o.status in ("pending", "processing") and o.event_id < d.event_id for o in same_key)
        return not busy and not earlier

    def stuck(self, d: Delivery, lost: frozenset[str]) -> bool:
        """A release or a stuck cancel takes ``d``: processing, its lease run out (every short
        lease has, when the machine acts) or its worker among the ``lost``."""
        return d.status == "processing" and (d.short_lease or d.worker in lost)

    def retrying(self) -> list[Delivery]:
        """The condition ``retrying``: pending after a failed attempt, waiting out its backoff."""
        return [d for d in self.in_status("pending") if not d.due and d.attempts > 0]

    def counts(self) -> Counter[tuple[str, str]]:
        return Counter((d.sub.name, d.status) for d in self.deliveries.values())

    # -- moving the model --------------------------------------------------------

    def add_event(self, event: PublishedEvent, delivery_ids: dict[str, int]) -> None:
        """A new event, fanned out to every subscription (``delivery_ids`` by subscription name)."""
        self.events[event.id] = event
        for sub in self.subs:
            ordering_key = event.ordering_key if sub.ordered else None
            d = Delivery(delivery_ids[sub.name], event.id, sub, ordering_key, due=not event.delayed)
            self.deliveries[d.id] = d

    def claimed(self, d: Delivery, token: str, short_lease: bool, worker: str) -> None:
        d.status, d.token, d.short_lease, d.worker = "processing", token, short_lease, worker
        d.attempts += 1

    def settled(self, d: Delivery, status: str) -> None:
        """The claim ended (completed, failed, released, recovered): its token is stale from now on."""
        assert d.token is not None
        self.stale.append((d.id, d.token))
        d.status, d.token, d.short_lease, d.worker = status, None, False, None

    def failed(self, d: Delivery, dead: bool, later: bool = False) -> None:
        """A failed attempt: dead, or retried now or (``later``) past the end of the run."""
        d.failures += 1
        d.due = dead or not later
        self.settled(d, "dead" if dead else "pending")

    def released(self, d: Delivery) -> None:
        d.attempts -= 1  # the claim's attempt is handed back with the delivery
        self.settled(d, "pending")

    def expired(self, d: Delivery) -> None:
        d.failures += 1
        self.settled(d, "dead" if d.attempts >= d.sub.max_attempts else "pending")

    def released_stuck(self, d: Delivery) -> None:
        """An operator's release: as a lease recovery, the attempt counts (its history row too)."""
        self.expired(d)

    def cancelled(self, d: Delivery) -> None:
        """Pending, or stuck processing (its token then stale), -> cancelled."""
        if d.status == "processing":
            self.settled(d, "cancelled")
        else:
            d.status = "cancelled"

    def retried_now(self, d: Delivery) -> None:
        d.due = True

    def replayed(self, d: Delivery) -> None:
        d.status, d.attempts, d.due = "pending", 0, True
        d.replays += 1

    def prunable(self, dedup_window: bool) -> tuple[list[int], list[int]]:
        """(deliveries, events) a prune with no completed retention deletes.

        Completed and cancelled deliveries go; dead ones are kept (the machine
        never gives them a retention). An event goes once none of its
        deliveries is left, unless it has a key still inside ``dedup_window``.
        """
        gone = [d.id for d in self.in_status("completed", "cancelled")]
        left = {d.event_id for d in self.deliveries.values() if d.id not in gone}
        events = [
            e.id
            for e in self.events.values()
            if e.id not in left and not (e.key is not None and dedup_window)
        ]
        return gone, events

    def pruned(self, deliveries: list[int], events: list[int]) -> None:
        for i in deliveries:
            del self.deliveries[i]
        for i in events:
            del self.events[i]
