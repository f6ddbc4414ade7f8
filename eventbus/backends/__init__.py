"""Storage backends behind one seam (:mod:`eventbus.backends.base`)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError
from .base import Backend

__all__ = ["Backend", "open_backend"]


def open_backend(dsn: str, schema: str | None = None, **options: Any) -> Backend:
    """Build the backend a DSN names: ``postgresql://…`` or ``sqlite:///path``."""
    if dsn.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresBackend

        return PostgresBackend(dsn, schema or "eventbus", **options)
    if dsn.startswith("sqlite://"):
        from .sqlite import SQLiteBackend

        backend: Backend = SQLiteBackend(dsn, **options)
        return backend
    raise ConfigurationError(
        f"unsupported DSN {dsn.split(':', 1)[0]!r}: use postgresql://… or sqlite:///path"
    )
