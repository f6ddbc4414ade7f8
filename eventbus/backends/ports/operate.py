"""Guarded admin writes by id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Operator"]


class Operator(Protocol):
    """Guarded admin writes by id: each touches only rows still in the expected state."""

    async def replay(self, ids: Sequence[int]) -> int:
        """Dead -> pending with attempts reset and the replay counted; returns how many moved."""
        ...

    async def purge(self, ids: Sequence[int]) -> int:
        """Delete dead deliveries and their attempt history; returns how many."""
        ...

    async def cancel(
        self,
        ids: Sequence[int],
        audit: dict[str, Any] | None = None,
        lost_after_seconds: float | None = None,
    ) -> int:
        """Pending -> cancelled; returns how many moved.

        With ``lost_after_seconds``, stuck processing deliveries are cancelled
        too (as :meth:`release_stuck` tells them): their lease token is
        cleared, so the worker that may still finish the run loses on it.

        ``audit``: an audit row (as :meth:`record_audit` takes, but its count)
        written in the same transaction with the count moved; the same for the
        subscription moves (1 or 0 for a pause or resume, the deliveries
        cancelled for a removal) and for :meth:`retry_now` and :meth:`release_stuck`.
        """
        ...

    async def retry_now(self, ids: Sequence[int], audit: dict[str, Any] | None = None) -> int:
        """Pending deliveries waiting for their run_at (a backoff, a delay) become due now.

        Guarded: only rows still pending with a run_at in the future move; due
        ones and every other state are left alone. The place in the claim order
        moves with run_at, so priorities keep their meaning; the subscriptions'
        workers are woken as by a publish. Returns how many moved.
        """
        ...

    async def release_stuck(
        self,
        ids: Sequence[int],
        lost_after_seconds: float,
        message: str,
        audit: dict[str, Any] | None = None,
    ) -> int:
        """Stuck processing deliveries go back as a lease recovery moves them; returns how many.

        Stuck: the lease ran out, or the worker holding it is lost (no
        heartbeat for ``lost_after_seconds`` by the store's clock, or no
        worker row). The attempt counts: back to pending with run_at kept, or
        dead when out of attempts; the history records ``Released`` with
        ``message``. The lease token is cleared, so the worker, should it
        still finish, is refused by the token guard. A processing delivery
        under a live lease of a live worker is left alone.
        """
        ...

    async def pause_subscription(self, name: str, audit: dict[str, Any] | None = None) -> bool:
        """Active -> paused: fan-out goes on, claims stop. False if it was not active.

        :class:`NotFound` if no subscription has this name.
        """
        ...

    async def resume_subscription(self, name: str, audit: dict[str, Any] | None = None) -> bool:
        """Paused or removed -> active, waking workers for its backlog. False if it was active.

        :class:`NotFound` if no subscription has this name.
        """
        ...

    async def remove_subscription(self, name: str, audit: dict[str, Any] | None = None) -> int:
        """Mark removed and cancel its pending deliveries, in one transaction.

        Fan-out and claims skip a removed subscription from the commit on; its
        dead deliveries stay for inspection and purge. Removing it again
        cancels what came back to pending since (a delivery that was running).
        Returns how many pending deliveries were cancelled; :class:`NotFound`
        if no subscription has this name.
        """
        ...

    async def record_audit(self, entry: dict[str, Any]) -> int:
        """Insert one audit row (the columns of ``audit_log`` but ``id`` and ``at``,
        which the database sets from its clock); returns its id."""
        ...

    async def audit_entries(
        self, *, limit: int, action: str | None = None, actor: str | None = None, before: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit rows newest first, ``action`` and ``actor`` matching exactly when given,
        with ids below ``before`` (keyset paging); ``at`` as an aware UTC datetime."""
        ...
