"""The rollup port on PostgreSQL: one INSERT per flush, one per minute's queue sample."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from ..ports import RollupRow
from ._db import PgDb

__all__ = ["PgRollup"]


class PgRollup:
    """:class:`~eventbus.backends.ports.RollupStore` on PostgreSQL (the contract is there)."""

    def __init__(self, db: PgDb) -> None:
        self.db = db
        self.q = db.q

    async def record(self, rows: Sequence[RollupRow]) -> int:
        """Insert the rows in one statement (see ``RollupStore.record``)."""
        if not rows:
            return 0
        columns = (
            [r.subscription for r in rows],
            [float(r.minute) for r in rows],
            [r.completed for r in rows],
            [r.failed for r in rows],
            [r.dead for r in rows],
            [orjson.dumps(r.durations, option=orjson.OPT_NON_STR_KEYS).decode() for r in rows],
        )
        async with self.db.conn("record rollup") as conn:
            result = await conn.execute(self.q["rollup_record"], *columns)
        return int(result.split()[-1])

    async def sample_queues(self, minute: int, cap: int) -> bool:
        """Sample the queues once per minute (see ``RollupStore.sample_queues``)."""
        async with self.db.conn("sample queues") as conn:
            if await conn.fetchval(self.q["rollup_sampled"], float(minute)) is not None:
                return False
            await conn.execute(self.q["rollup_sample"], float(minute), cap)
        return True
