"""The PostgreSQL queries: every named block prepares, and each port module finds its own.

``queries/<port>.sql`` holds the blocks the port module ``<port>.py`` reads
(``_db.py``, the session every port shares, reads the publish blocks and may
read any); every block defined is read somewhere, and none is missing.
"""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import asyncpg
import pytest

import eventbus.backends.postgres as pg_package

_NAME_RE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_PACKAGE = Path(pg_package.__file__).parent
_SHARED = {"_db"}


def _defined() -> dict[str, str]:
    """Every block name, with the stem of the file that defines it."""
    folder = resources.files("eventbus.backends.postgres").joinpath("queries")
    return {
        name: entry.name.removesuffix(".sql")
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
        for name in _NAME_RE.findall(entry.read_text("utf-8"))
        if not name.startswith("_")  # a fragment, included by other blocks
    }


def _read_by(module: Path) -> set[str]:
    """The block names a module reads: each ``q["name"]`` (``self.q``, ``self.db.q``, ``db.q``)."""
    names = set()
    for node in ast.walk(ast.parse(module.read_text("utf-8"))):
        if not isinstance(node, ast.Subscript) or not isinstance(node.slice, ast.Constant):
            continue
        target = node.value
        if (isinstance(target, ast.Attribute) and target.attr == "q") or (
            isinstance(target, ast.Name) and target.id == "q"
        ):
            names.add(str(node.slice.value))
    return names


def test_each_port_module_reads_only_blocks_of_its_own_file_and_every_block_is_read() -> None:
    defined = _defined()
    read: dict[str, set[str]] = {m.stem: _read_by(m) for m in _PACKAGE.glob("*.py")}
    missing = {(module, n) for module, names in read.items() for n in names if n not in defined}
    assert not missing, f"read but defined in no queries/*.sql: {sorted(missing)}"
    elsewhere = {
        (module, n, defined[n])
        for module, names in read.items()
        if module not in _SHARED
        for n in names
        if defined[n] != module
    }
    assert not elsewhere, f"read from another port's file (module, name, file): {sorted(elsewhere)}"
    unused = set(defined) - set().union(*read.values())
    assert not unused, f"defined but read by no module: {sorted(unused)}"


@pytest.mark.parametrize("append_only", [False, True])
async def test_every_postgres_query_prepares(pg_target, append_only: bool) -> None:
    bus = pg_target.bus(append_only=append_only)  # the append-only path rewrites its reads
    try:
        await bus.migrate()
        conn = await asyncpg.connect(pg_target.dsn)
        try:
            for name, sql in bus.backend.db.q.items():
                if name == "migrations_table":
                    continue
                await conn.prepare(sql)
        finally:
            await conn.close()
    finally:
        await bus.aclose()
