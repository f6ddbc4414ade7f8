"""Group commit of transitions, and grouped reads of facts.

Visits finishing together share one transaction.

A visit's transition is queued; whoever holds the lock writes everything
queued so far in one :meth:`~eventbus.backends.base.WorkflowStore.commit_many`
(one commit, one fsync), and every waiter gets its own guarded result. While a
batch is being written, the next one gathers, so batches grow with the load
and a lone visit commits at once. Visits starting together read their
facts in one read the same way (:class:`LoadQueue`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anyio

from ..backends.base import WorkflowFacts, WorkflowStore, WorkflowTransition
from ..errors import BackendError

__all__ = ["CommitQueue", "LoadQueue"]

log = logging.getLogger("eventbus.workflows")


@dataclass
class _Slot:
    transition: WorkflowTransition
    done: bool = False
    version: int | None = None
    error: BaseException | None = None


class CommitQueue:
    """One per bus: batches the transitions of its concurrent visits."""

    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self._queued: list[_Slot] = []
        self._lock = anyio.Lock()

    async def commit(self, t: WorkflowTransition) -> int | None:
        """Commit ``t`` (with whatever else is queued); its new version, or None if refused."""
        slot = _Slot(t)
        self._queued.append(slot)
        with anyio.CancelScope(shield=True):  # a queued transition is always written or failed
            async with self._lock:
                if not slot.done:
                    batch, self._queued = self._queued, []
                    await self._write(batch)
        if slot.error is not None:
            raise slot.error
        return slot.version

    async def _write(self, batch: list[_Slot]) -> None:
        try:
            versions = await self.store.commit_many([s.transition for s in batch])
        except BackendError as exc:
            if len(batch) == 1:
                batch[0].error, batch[0].done = exc, True
                return
            log.warning("a batch of %d transitions failed (%s); writing them one by one", len(batch), exc)
            for s in batch:
                await self._write([s])
            return
        for s, version in zip(batch, versions, strict=True):
            s.version, s.done = version, True


@dataclass
class _Read:
    key: str
    done: bool = False
    row: WorkflowFacts | None = None
    error: BaseException | None = None


class LoadQueue:
    """One per machine on a bus: the facts of visits starting together, in one read."""

    def __init__(self, store: WorkflowStore, machine: str) -> None:
        self.store = store
        self.machine = machine
        self._queued: list[_Read] = []
        self._lock = anyio.Lock()

    async def load(self, key: str) -> WorkflowFacts | None:
        """The committed facts of ``key`` (read with whatever else is queued), or None."""
        read = _Read(key)
        self._queued.append(read)
        with anyio.CancelScope(shield=True):  # a batch taken from the queue is always answered
            async with self._lock:
                if not read.done:
                    batch, self._queued = self._queued, []
                    await self._read(batch)
        if read.error is not None:
            raise read.error
        return read.row

    async def _read(self, batch: list[_Read]) -> None:
        rows: dict[str, WorkflowFacts] = {}
        failed: BackendError | None = None
        try:
            rows = await self.store.facts(self.machine, sorted({r.key for r in batch}))
        except BackendError as exc:
            failed = exc
        for r in batch:
            r.row, r.error, r.done = rows.get(r.key), failed, True
