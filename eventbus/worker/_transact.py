"""Running a transactional handler: its writes, its completion and its follow-ups in one transaction.

The handler runs inside the transaction the backend opens for it
(``DeliveryStore.transaction``) and gets its connection as ``ctx.connection``;
its completion is written last in the same transaction, fenced by the lease
token, and commits everything or nothing. A failure (the handler raised or
timed out, the transaction could not open or commit) rolls the handler's
writes back and is returned, to be written by the result writer in a
transaction of its own, as any failure is. Only these deliveries pay a
transaction each; the others' results keep their batched writes.
"""

from __future__ import annotations

from collections.abc import Callable

from ..backends.base import ClaimedDelivery, Completion, DeliveryStore, Failure
from ..errors import EventBusError
from ..router import Subscription
from ._execute import Executor

__all__ = ["TransactionalRunner"]


class TransactionalRunner:
    """Runs transactional handlers; ``settled(completion, applied)`` is told of each commit or refusal."""

    def __init__(
        self,
        deliveries: DeliveryStore,
        executor: Executor,
        settled: Callable[[Completion, bool], None],
    ) -> None:
        self.deliveries = deliveries
        self.executor = executor
        self.settled = settled

    async def run(self, sub: Subscription, delivery: ClaimedDelivery, started: float) -> Failure | None:
        """Run the handler in its transaction; the failure to record, or None when the completion
        was committed (or refused as stale, everything rolled back)."""
        timeout = sub.timeout_seconds if sub.timeout_seconds is not None else float("inf")
        try:
            await self.executor.before_transaction()
            async with self.deliveries.transaction(timeout) as transaction:
                result = await self.executor.invoke(sub, delivery, started, transaction.connection)
                if isinstance(result, Failure):
                    return result  # leaving the block rolls the handler's writes back
                applied = await transaction.commit(result)
        except EventBusError as exc:  # could not open, complete or commit: nothing was written
            return self.executor.failure(sub, delivery, exc, started)
        self.settled(result, applied)
        return None
