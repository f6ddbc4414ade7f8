"""Every named SQLite query prepares on a migrated file, and each is used.

SQLite compiles a statement only when it runs it, so its queries are run as
``EXPLAIN <query>`` (compiled in full: every table, column and function
resolved, nothing executed) with every parameter bound to NULL, inside a
transaction that is rolled back. The names a backend's modules ask for
(``q["name"]``, ``db.fetch("name", …)``, ``db.write_if("name", …)``) are read
from their source, so a query no module asks for, or a name no file defines,
fails here rather than in production. The SQLite dead-letter walk is checked
to read the partial index of dead rows, as the walk it replaced did.
"""

from __future__ import annotations

import ast
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

from eventbus._priority import DEFAULT_PRIORITY_STEP_SECONDS
from eventbus.backends._sql import load_queries, with_priority_step
from eventbus.backends.sqlite import SQLiteBackend

ROOT = Path(__file__).resolve().parents[2]
_LOOKUPS = {"fetch", "write_if"}
"""Methods of a backend's session whose first argument names a query."""


class _Nulls(defaultdict[str, Any]):
    """Every named parameter a statement asks for, bound to NULL."""

    def __init__(self) -> None:
        super().__init__(lambda: None)


async def test_every_sqlite_query_prepares(tmp_path: Path) -> None:
    path = tmp_path / "bus.db"
    backend = SQLiteBackend(f"sqlite:///{path}", migrate=True)
    await backend.schema.migrate()
    await backend.aclose()
    conn = sqlite3.connect(path, isolation_level=None)
    failed: dict[str, str] = {}
    try:
        conn.execute("BEGIN")
        queries = with_priority_step(load_queries("sqlite", "main"), DEFAULT_PRIORITY_STEP_SECONDS)
        for name, sql in queries.items():
            try:
                conn.execute(f"EXPLAIN {sql}", _Nulls()).fetchall()
            except sqlite3.Error as exc:
                failed[name] = str(exc)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert failed == {}


async def test_the_sqlite_dead_letter_walk_reads_the_dead_index(tmp_path: Path) -> None:
    """A thousand dead among ten million deliveries: the walk reads the dead letters' index, not the table."""
    path = tmp_path / "bus.db"
    backend = SQLiteBackend(f"sqlite:///{path}", migrate=True)
    await backend.schema.migrate()
    await backend.aclose()
    q = load_queries("sqlite", "main")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("ANALYZE")
        conn.execute("DELETE FROM sqlite_stat1")
        conn.executemany(
            "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES (?, ?, ?)",
            [
                ("deliveries", None, "10000000"),
                ("deliveries", "deliveries_dead", "1000 100 1"),
                ("deliveries", "deliveries_dead_newest", "1000 1"),
                ("events", None, "5000000"),
                ("subscriptions", None, "10"),
            ],
        )
        conn.execute("ANALYZE sqlite_schema")  # reload the statistics

        def plan(name: str) -> list[str]:
            return [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {q[name]}", _Nulls())]

        assert plan("delivery_ids_dead")[0] == "SEARCH d USING INDEX deliveries_dead_newest (id>?)"
        assert plan("delivery_ids")[0] == "SEARCH d USING INTEGER PRIMARY KEY (rowid>?)"
    finally:
        conn.close()


def _names(node: ast.expr) -> list[str]:
    """The query names an expression spells out: a string, or either branch of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _names(node.body) + _names(node.orelse)
    return []


def _asked(tree: ast.AST) -> set[str]:
    """Names looked up as ``q[...]`` / ``….q[...]`` or passed first to a lookup method."""
    asked: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            target = node.value
            if (isinstance(target, ast.Name) and target.id == "q") or (
                isinstance(target, ast.Attribute) and target.attr == "q"
            ):
                asked.update(_names(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in _LOOKUPS:
                asked.update(_names(node.args[0]))
    return asked


def test_sqlite_modules_ask_for_exactly_the_queries_defined() -> None:
    folder = ROOT / "eventbus" / "backends" / "sqlite"
    asked: set[str] = set()
    for module in folder.glob("*.py"):
        asked |= _asked(ast.parse(module.read_text("utf-8")))
    defined = set(load_queries("sqlite", "main"))
    assert sorted(asked - defined) == [], "asked for but defined in no queries/*.sql"
    assert sorted(defined - asked) == [], "defined but asked for by no module"
