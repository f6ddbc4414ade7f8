"""The schema a backend keeps."""

from __future__ import annotations

from typing import Protocol

__all__ = ["SchemaStore"]


class SchemaStore(Protocol):
    """The schema: migrations, statistics, and dropping it all."""

    async def migrate(self) -> list[str]:
        """Apply pending migration files under a lock; return the names applied."""
        ...

    async def analyze(self) -> None:
        """Refresh the planner's statistics of the bus's tables (as autovacuum would)."""
        ...

    async def drop(self) -> None:
        """Delete the bus's tables and data for good: the schema, or the SQLite file. Closes the backend."""
        ...
