"""Migration files: discovery, naming rules and checksums.

Files are named ``NNNN_verb_object.sql``, one folder per backend, and are
append-only: an applied file that changes is refused, never re-run. Each
backend applies them one transaction per file under its own lock.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from ..errors import MigrationChecksumMismatch, MigrationError, SchemaNotMigrated

__all__ = ["Migration", "check_applied", "discover", "not_migrated", "pending"]

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9]+(?:_[a-z0-9]+)+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def _folder(backend: str) -> Traversable:
    packaged = resources.files("eventbus").joinpath("_migrations", backend)
    if packaged.is_dir():
        return packaged
    # Development checkout: the migrations sit beside the package.
    return Path(__file__).resolve().parents[2] / "migrations" / backend


def discover(backend: str) -> list[Migration]:
    """Return the migrations of one backend, in version order."""
    folder = _folder(backend)
    if not folder.is_dir():
        raise MigrationError(f"no migrations folder for backend {backend!r}")
    found: list[Migration] = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_RE.match(entry.name)
        if match is None:
            raise MigrationError(f"migration file {entry.name!r} is not named NNNN_verb_object.sql")
        found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {backend}: {versions}")
    return found


def check_applied(migrations: list[Migration], applied: dict[int, str]) -> None:
    """Refuse to run when an applied file has been edited or removed."""
    by_version = {m.version: m for m in migrations}
    for version, checksum in sorted(applied.items()):
        migration = by_version.get(version)
        if migration is None:
            raise MigrationError(f"applied migration {version:04d} is missing from this release")
        if migration.checksum != checksum:
            raise MigrationChecksumMismatch(
                f"migration {migration.name} was edited after it was applied "
                "(migrations are append-only: add a new file instead)"
            )


def pending(migrations: list[Migration], applied: dict[int, str]) -> list[Migration]:
    """Check the applied files, then return those still to run."""
    check_applied(migrations, applied)
    return [m for m in migrations if m.version not in applied]


def not_migrated(where: str, todo: list[Migration]) -> SchemaNotMigrated:
    """The error for a bus opened on a schema that is missing or behind this release."""
    what = f"{len(todo)} migration(s) pending ({todo[0].name}…)" if todo else "no eventbus schema"
    return SchemaNotMigrated(f"{where}: {what}; run `eventbus migrate` (or open the bus with migrate=True)")
