"""Writing handler results: completions and failures, in batches, fenced by lease."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import anyio

from ..backends._wakeup import SWEEP
from ..backends.base import Backend, Completion, Failure
from ..errors import BackendError
from ..types import DeliveryId
from ._shield import Shield

__all__ = ["ResultWriter"]

log = logging.getLogger("eventbus.worker")

_WRITE_BATCH = 500
"""Most results written in one transaction: keeps each commit short however
large the buffer grew while the database was slow."""

FLUSH_SECONDS = 10.0
"""How long the final flush keeps retrying a database that refuses writes."""


class ResultWriter:
    """Buffers results and writes them from one task, so results batch naturally.

    Completions (with their follow-up events) go in one transaction per batch,
    fenced by the lease token; a result the database refuses as stale is logged
    and dropped. ``forget`` is called with each delivery once its result is
    written (or refused).
    """

    def __init__(
        self, backend: Backend, forget: Callable[[DeliveryId], object], shield: Shield | None = None
    ) -> None:
        self.backend = backend
        self.forget = forget
        self.shield = shield or Shield()
        self.processed = 0
        self._completions: list[Completion] = []
        self._failures: list[Failure] = []
        self._wanted = anyio.Event()
        self._lock = anyio.Lock()

    def add(self, result: Completion | Failure) -> None:
        if isinstance(result, Completion):
            self._completions.append(result)
        else:
            self._failures.append(result)
        self._wanted.set()

    async def run(self) -> None:
        """Write whatever has accumulated, whenever something has."""
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            if not await self.write():
                await anyio.sleep(0.5)
                self._wanted.set()

    async def write(self, deadline: float = math.inf) -> bool:
        """Write buffered results; return False when the database refused.

        Shielded and serialised: a write in progress is never cut off by a
        graceful stop (that would roll back completions whose handlers already
        ran), and the final flush waits for it. A hard stop aborts the shield:
        what is not written then is covered by its lease.
        """
        ok = False
        with self.shield(deadline):
            async with self._lock:
                ok = await self._write_completions() and await self._write_failures()
        return ok

    async def flush_all(self, seconds: float = FLUSH_SECONDS) -> None:
        """On stop: write everything, waiting for a write in progress.

        A database that refuses is retried for ``seconds`` at most (a hard stop
        ends it at once): the leases of what stays unwritten cover it.
        """
        deadline = anyio.current_time() + seconds
        while not self.shield.aborted:
            ok = await self.write(deadline)
            if not (self._completions or self._failures):
                return
            if anyio.current_time() >= deadline:
                break
            if not ok:
                await anyio.sleep(0.5)
        log.error("gave up writing results; their leases will expire and they will be re-run")

    async def _write_completions(self) -> bool:
        completions, self._completions = self._completions, []
        for start in range(0, len(completions), _WRITE_BATCH):
            chunk = completions[start : start + _WRITE_BATCH]
            try:
                done = await self.backend.complete(chunk)
            except BackendError as exc:
                log.warning("could not write %d completions, retrying: %s", len(completions) - start, exc)
                self._completions[:0] = completions[start:]
                return False
            self.processed += len(done)
            self._settle([c.delivery_id for c in chunk], done, "completion")
        return True

    async def _write_failures(self) -> bool:
        failures, self._failures = self._failures, []
        for start in range(0, len(failures), _WRITE_BATCH):
            chunk = failures[start : start + _WRITE_BATCH]
            try:
                failed = await self.backend.fail(chunk)
            except BackendError as exc:
                log.warning("could not write %d failures, retrying: %s", len(failures) - start, exc)
                self._failures[:0] = failures[start:]
                return False
            self._settle([f.delivery_id for f in chunk], failed, "failure")
            if any(not f.dead and f.delivery_id in failed for f in chunk):
                # Re-plan the wake-up from the new run_at (the loop may be in a long wait).
                self.backend.wake_local({SWEEP})
        return True

    def _settle(self, ids: list[DeliveryId], accepted: set[DeliveryId], what: str) -> None:
        for delivery_id in ids:
            self.forget(delivery_id)
            if delivery_id not in accepted:
                log.warning(
                    "stale %s of delivery %s rejected: this worker no longer holds its lease",
                    what,
                    delivery_id,
                )
