"""The :class:`~eventbus.backends.base.RollupStore` port on SQLite: one write per flush, one per sample."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from ..ports import RollupRow
from ._db import SQLiteDb
from ._link import Queries

__all__ = ["SQLiteRollup"]


class SQLiteRollup:
    """Appending to the throughput rollup (the contract is on ``RollupStore``)."""

    def __init__(self, db: SQLiteDb) -> None:
        self._db = db

    async def record(self, rows: Sequence[RollupRow]) -> int:
        if not rows:
            return 0
        data = [
            [r.subscription, r.minute, r.completed, r.failed, r.dead,
             orjson.dumps(r.durations, option=orjson.OPT_NON_STR_KEYS).decode()]
            for r in rows
        ]  # fmt: skip
        return await self._db.write(_record, orjson.dumps(data).decode())

    async def sample_queues(self, minute: int, cap: int) -> bool:
        sampled = await self._db.write_if("rollup_unsampled", {"minute": minute}, _sample, minute, cap)
        return bool(sampled)


# -- units of work (on the writer's thread, under the write lock) ---------------------


def _record(conn: sqlite3.Connection, q: Queries, now: float, rows: str) -> int:
    return conn.execute(q["rollup_record"], {"rows": rows}).rowcount


def _sample(conn: sqlite3.Connection, q: Queries, now: float, minute: int, cap: int) -> bool:
    params: dict[str, Any] = {"minute": minute, "cap": cap, "now": now}
    conn.execute(q["rollup_sample"], params)
    return True
