"""A test's bus starts on a copy of a migrated store instead of migrating an empty one.

Migrating from nothing (fourteen files, one transaction each) was the largest
fixed cost of a backend test. The ``make_bus`` fixture (tests/conftest.py)
therefore seeds its target once, before its first bus migrates:

* SQLite: a copy of a file this test process migrated once with the real
  ``Bus.migrate`` (the copy is a few milliseconds).
* PostgreSQL: every migration file applied in one transaction with one round
  trip, under the migration lock, and recorded in ``schema_migrations`` with
  its checksum, exactly as ``Bus.migrate`` records it.

The bus then runs its own ``migrate``, which finds nothing pending and checks the
recorded checksums. A target that already has a store (a test that migrated it
through the command line first) is left as it is. Migrating itself, from nothing,
concurrently, interrupted, is what ``tests/contract/schema/`` and
``tests/integration/test_migrate_interrupted.py`` test on empty targets, and
any test that opens its bus without ``make_bus`` still migrates from nothing.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import anyio
import asyncpg

from eventbus import Bus
from eventbus.backends import _migrations
from eventbus.backends._sql import load_queries, quote_schema
from eventbus.backends.postgres._db import notify_channel

__all__ = ["seed_postgres", "seed_sqlite"]

_SQLITE_FILES = ("", "-wal")


async def _migrated_sqlite_file(folder: Path) -> Path:
    """A SQLite file migrated by ``Bus.migrate`` in ``folder``, made the first time it is asked for."""
    path = folder / "template.db"
    if not path.exists():
        building = folder / "building.db"
        bus = Bus(f"sqlite:///{building}")
        try:
            await bus.migrate()
        finally:
            await bus.aclose()
        for suffix in _SQLITE_FILES:  # the close checkpoints: normally only the main file is left
            if Path(f"{building}{suffix}").exists():
                Path(f"{building}{suffix}").rename(f"{path}{suffix}")
    return path


async def seed_sqlite(dsn: str, template_folder: Path) -> None:
    """Put a copy of the migrated template at ``dsn``'s path unless a file is already there."""
    target = Path(dsn.removeprefix("sqlite:///").split("?", 1)[0])
    if target.exists():
        return
    template = await _migrated_sqlite_file(template_folder)
    for suffix in _SQLITE_FILES:
        source = Path(f"{template}{suffix}")
        if source.exists():
            await anyio.to_thread.run_sync(shutil.copyfile, source, f"{target}{suffix}")


@functools.cache
def _migrations_text() -> str:
    """Every PostgreSQL migration and its record, ``{schema}`` still to be filled in."""
    parts = []
    for m in _migrations.discover("postgres"):
        parts.append(m.sql)
        parts.append(
            "INSERT INTO {schema}.schema_migrations (version, name, checksum) "
            f"VALUES ({m.version}, '{m.name}', '{m.checksum}');"
        )
    return "\n".join(parts)


def _postgres_script(q: dict[str, str], schema: str) -> str:
    """The schema, its migrations table, then every migration and its record, as one text."""
    quoted = quote_schema(schema)
    table = q["migrations_table"].rstrip().rstrip(";")
    return f"CREATE SCHEMA {quoted};\n{table};\n" + _migrations_text().replace("{schema}", quoted)


async def seed_postgres(direct_dsn: str, schema: str) -> None:
    """Create ``schema`` fully migrated in one transaction, unless it already exists."""
    q = load_queries("postgres", schema)
    conn = await asyncpg.connect(direct_dsn)
    try:
        async with conn.transaction():
            # The lock Bus.migrate takes: a migrate started meanwhile waits, then finds all applied.
            await conn.execute(q["migration_lock"], notify_channel(schema))
            exists = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
            if not exists:
                await conn.execute(_postgres_script(q, schema))
    finally:
        await conn.close()
