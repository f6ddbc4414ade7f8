"""Reading PostgreSQL plans in the plan tests."""

from __future__ import annotations

import re
from typing import Any

import asyncpg


def is_part_of(name: str | None, table: str) -> bool:
    """Whether a plan's relation is ``table`` or one of its partitions (the event log's chunks)."""
    return name is not None and (
        name == table or re.fullmatch(re.escape(table) + r"_(\d+|kept)", name) is not None
    )


def nodes(plan: dict) -> list[dict]:
    """Every node of a plan (EXPLAIN JSON)."""
    found, stack = [], [plan["Plan"]]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        found.append(node)
    return found


def scans(plan: dict, table: str) -> list[dict]:
    """The scan nodes of ``table`` (or of its partitions) in a plan (EXPLAIN JSON)."""
    return [node for node in nodes(plan) if is_part_of(node.get("Relation Name"), table)]


def rows_read(plan: dict, table: str) -> int:
    """Rows the scans of ``table`` produced or filtered out, times their loops (EXPLAIN ANALYZE JSON)."""
    return sum(
        node["Actual Loops"] * (node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
        for node in scans(plan, table)
    )


def rows_compared(plan: dict) -> int:
    """Rows the joins of a plan compared and rejected, times their loops (EXPLAIN ANALYZE JSON): a
    nested loop whose inner side is a scan or a materialized set rather than a probe by key
    compares each outer row with all of it."""
    return sum(node["Actual Loops"] * node.get("Rows Removed by Join Filter", 0) for node in nodes(plan))


def partitions_read(plan: dict, table: str) -> set[str]:
    """The partitions of ``table`` a plan ran a scan of at least once (EXPLAIN ANALYZE JSON)."""
    return {node["Relation Name"] for node in scans(plan, table) if node.get("Actual Loops")}


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
