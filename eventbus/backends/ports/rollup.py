"""The throughput rollup: what the workers append per (subscription, minute), and the queue samples.

The charts of the dashboard read this small table (through
:meth:`~eventbus.backends.ports.Inspector.rollup`), never the deliveries.
Every write is an INSERT: counts are summed by the reader, never updated in
place, so the rollup adds no dead row per delivery.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

__all__ = ["RollupBucket", "RollupRow", "RollupStore"]


class RollupRow(msgspec.Struct, frozen=True):
    """What one worker counted for one subscription in one minute."""

    subscription: str
    minute: int
    """The minute's start, in epoch seconds (a multiple of 60)."""
    completed: int = 0
    failed: int = 0
    """Failed attempts that will be retried."""
    dead: int = 0
    """Failed attempts that went to the dead-letter queue."""
    durations: dict[int, int] = {}
    """Handler runs by duration bucket (:mod:`eventbus.throughput`)."""


class RollupBucket(msgspec.Struct, frozen=True):
    """The rollup of one subscription over one step of a window: every worker's rows summed."""

    subscription: str
    start: int
    """The step's start, in epoch seconds (a multiple of the step)."""
    completed: int = 0
    failed: int = 0
    dead: int = 0
    durations: dict[int, int] = {}
    pending: int | None = None
    """The largest queue sample of the step (None: no sample)."""
    lag_seconds: float | None = None
    """The largest lag sampled in the step (None: no sample, or nothing was due)."""


class RollupStore(Protocol):
    """Appending to the throughput rollup."""

    async def record(self, rows: Sequence[RollupRow]) -> int:
        """Insert ``rows`` in one statement; returns how many were stored.

        A row of a subscription the database does not know is dropped.
        """
        ...

    async def sample_queues(self, minute: int, cap: int) -> bool:
        """Sample every active or paused subscription's queue for ``minute``, unless already sampled.

        One row per subscription: its pending deliveries (counted no further
        than ``cap``) and the age of its oldest due pending delivery. Returns
        False when this minute had its sample (another worker's, usually):
        then nothing is counted. Two workers sampling at once store one
        sample per subscription.
        """
        ...
