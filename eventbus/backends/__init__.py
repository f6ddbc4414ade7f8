"""Storage backends behind one seam (:mod:`eventbus.backends.base`).

Each backend's driver (asyncpg, aiosqlite) is imported only when a DSN names
that backend, so ``import eventbus`` loads neither.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ConfigurationError
from .base import Backend

__all__ = ["Backend", "open_backend"]

_BACKENDS = {
    "postgresql": ("eventbus.backends.postgres", "PostgresBackend"),
    "postgres": ("eventbus.backends.postgres", "PostgresBackend"),
    "sqlite": ("eventbus.backends.sqlite", "SQLiteBackend"),
}


def open_backend(dsn: str, schema: str | None = None, **options: Any) -> Backend:
    """Build the backend a DSN names: ``postgresql://…`` or ``sqlite:///path``."""
    scheme, sep, _rest = dsn.partition("://")
    if not sep or scheme not in _BACKENDS:
        raise ConfigurationError(
            f"unsupported DSN {dsn.split(':', 1)[0]!r}: use postgresql://… or sqlite:///path"
        )
    module_name, class_name = _BACKENDS[scheme]
    backend_class = getattr(importlib.import_module(module_name), class_name)
    if scheme != "sqlite":
        options["schema"] = schema or "eventbus"
    backend: Backend = backend_class(dsn, **options)
    return backend
