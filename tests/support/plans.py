"""Reading PostgreSQL plans in the plan tests."""

from __future__ import annotations


def rows_read(plan: dict, table: str) -> int:
    """Rows the scans of ``table`` produced or filtered out, times their loops (EXPLAIN ANALYZE JSON)."""
    total, stack = 0, [plan["Plan"]]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        if node.get("Relation Name") == table:
            total += node["Actual Loops"] * (node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
    return total
