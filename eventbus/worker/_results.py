"""Writing handler results: completions and failures, in batches, fenced by lease."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from ..backends._wakeup import SWEEP
from ..backends.base import Completion, DeliveryStore, Failure, LeaseKey, Wakeups
from ..errors import BackendUnavailable
from ..observe import DeliveryTracker, NoHooks
from ._failures import FailureLog
from ._shield import Shield

__all__ = ["ResultWriter"]

log = logging.getLogger("eventbus.worker")

_WRITE_BATCH = 500
"""Most results written in one transaction: keeps each commit short however
large the buffer grew while the database was slow."""

FLUSH_SECONDS = 10.0
"""How long the final flush keeps retrying a database that refuses writes."""

R = TypeVar("R", Completion, Failure)


class ResultWriter:
    """Buffers results and writes them from one task, so results batch naturally.

    Completions (with their follow-up events) go in one transaction per batch,
    fenced by the lease token; a result the database refuses as stale is logged
    and dropped. Only unavailability is retried: when the database refuses a
    batch for any other reason, the batch is split until the result it cannot
    store is alone, and that result is replaced by the failure ``unstorable``
    builds (or dropped, when it returns None), so one bad result never holds
    up the others. ``forget`` is called with each (delivery, token) once its
    result is written or refused.
    """

    def __init__(
        self,
        deliveries: DeliveryStore,
        wakeups: Wakeups,
        forget: Callable[[LeaseKey], object],
        unstorable: Callable[[Completion | Failure, Exception], Failure | None],
        shield: Shield | None = None,
        failures: FailureLog | None = None,
    ) -> None:
        self.deliveries = deliveries
        self.wakeups = wakeups
        self.forget = forget
        self.unstorable = unstorable
        self.shield = shield or Shield()
        self.failure_log = failures or FailureLog(log)
        self.processed = 0
        self.tracker = DeliveryTracker(NoHooks(), "")
        """Told of every result written or refused (logs, metrics, traces)."""
        self._completions: list[Completion] = []
        self._failures: list[Failure] = []
        self._wanted = anyio.Event()
        self._lock = anyio.Lock()

    def add(self, result: Completion | Failure) -> None:
        if isinstance(result, Completion):
            self._completions.append(result)
        else:
            self._failures.append(result)
        if not self._wanted.is_set():  # set once per write, not once per result
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
        """Write buffered results; return False when the database was unavailable.

        Shielded and serialised: a write in progress is never cut off by a
        graceful stop (that would roll back completions whose handlers already
        ran), and the final flush waits for it. A hard stop aborts the shield:
        what is not written then is covered by its lease.
        """
        ok = False
        with self.shield(deadline):
            async with self._lock:
                completions, self._completions = self._completions, []
                left = await self._write(completions, self.deliveries.complete, "completion")
                self._completions[:0] = left
                failures, self._failures = self._failures, []
                left_failures = await self._write(failures, self.deliveries.fail, "failure")
                self._failures[:0] = left_failures
                ok = not (left or left_failures)
        return ok

    async def between_writes(self) -> None:
        """Wait until a write in progress has ended and what it wrote is forgotten."""
        async with self._lock:
            pass

    async def flush_all(self, seconds: float = FLUSH_SECONDS) -> None:
        """On stop: write everything, waiting for a write in progress.

        A database that refuses is retried for ``seconds`` at most (a hard stop
        ends it at once): the leases of what stays unwritten cover it.
        """
        try:
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
        finally:
            self.failure_log.flush()

    async def _write(
        self, results: list[R], store: Callable[[Sequence[R]], Awaitable[set[LeaseKey]]], what: str
    ) -> list[R]:
        """Write ``results`` in batches; return those left unwritten while the database is unavailable."""
        todo: list[list[R]] = [results[i : i + _WRITE_BATCH] for i in range(0, len(results), _WRITE_BATCH)]
        todo.reverse()  # a stack: the next batch is popped from the end
        while todo:
            chunk = todo.pop()
            try:
                accepted = await store(chunk)
            except BackendUnavailable as exc:
                left = list(chunk)
                for part in reversed(todo):
                    left += part
                log.warning("could not write %d %ss, retrying: %s", len(left), what, exc)
                return left
            except Exception as exc:  # any refusal is the batch's own: isolate it
                if len(chunk) == 1:
                    self._refused(chunk[0], exc)
                else:
                    todo += [chunk[len(chunk) // 2 :], chunk[: len(chunk) // 2]]
                continue
            self._settle(chunk, accepted, what)
        return []

    def _refused(self, result: Completion | Failure, exc: Exception) -> None:
        """The database cannot store ``result``: record a failed attempt in its place."""
        replacement = self.unstorable(result, exc)
        what = "completion" if isinstance(result, Completion) else "failure"
        if replacement is None:
            self.forget(result.lease)
            log.error(
                "the %s of delivery %s cannot be stored and was dropped (%s: %s); "
                "its lease will expire and it will run again",
                what,
                result.delivery_id,
                type(exc).__name__,
                exc,
            )
            return
        log.warning(
            "the %s of delivery %s cannot be stored (%s: %s); recording a failed attempt instead",
            what,
            result.delivery_id,
            type(exc).__name__,
            exc,
        )
        self.add(replacement)

    def settled(self, completion: Completion, applied: bool) -> None:
        """A completion committed (or refused) elsewhere, in a transactional handler's own
        transaction: counted, logged and forgotten as one written here."""
        self._settle([completion], {completion.lease} if applied else set(), "completion")

    def _settle(self, chunk: Sequence[Completion | Failure], accepted: set[LeaseKey], what: str) -> None:
        self.tracker.written(chunk, accepted)
        retried = False
        for result in chunk:
            lease = (result.delivery_id, result.lease_token)
            self.forget(lease)
            if lease not in accepted:
                log.warning(
                    "stale %s of delivery %s refused: this run no longer holds its lease",
                    what,
                    result.delivery_id,
                    extra={"delivery_id": result.delivery_id, "outcome": "refused"},
                )
            elif isinstance(result, Failure):
                self.failure_log.record(result)
                retried = retried or not result.dead
            else:
                self.processed += 1
        if retried:
            # Re-plan the wake-up from the new run_at (the loop may be in a long wait).
            self.wakeups.wake_local({SWEEP})
