"""Reading PostgreSQL plans in the plan tests."""

from __future__ import annotations

from typing import Any

import asyncpg


def rows_read(plan: dict, table: str) -> int:
    """Rows the scans of ``table`` produced or filtered out, times their loops (EXPLAIN ANALYZE JSON)."""
    total, stack = 0, [plan["Plan"]]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        if node.get("Relation Name") == table:
            total += node["Actual Loops"] * (node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
    return total


async def migrated(target: Any) -> tuple[dict[str, str], asyncpg.Connection, str]:
    """``target``'s schema migrated: its queries, a connection straight to it, and the quoted schema."""
    bus = target.bus()
    try:
        await bus.migrate()
        q = bus.backend.db.q
    finally:
        await bus.aclose()
    return q, await asyncpg.connect(target.dsn), f'"{target.schema}"'


async def subscription(conn: asyncpg.Connection, s: str) -> int:
    """A subscription 'h' of order.placed in schema ``s`` (quoted); its id."""
    return int(
        await conn.fetchval(
            f"INSERT INTO {s}.subscriptions (name, event_type, max_attempts, lease_seconds) "
            "VALUES ('h', 'order.placed', 5, 30) RETURNING id"
        )
    )
