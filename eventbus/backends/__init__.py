"""Storage backends behind one seam (:mod:`eventbus.backends.base`).

Each backend's driver (asyncpg, aiosqlite) is imported only when a DSN names
that backend, so ``import eventbus`` loads neither.
"""

from __future__ import annotations

import importlib
import inspect
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
    _check_options(backend_class, scheme, options)
    backend: Backend = backend_class(dsn, **options)
    return backend


def _check_options(backend_class: type, scheme: str, options: dict[str, Any]) -> None:
    """Refuse an option the backend does not take (a typo, or a PostgreSQL option on SQLite)."""
    accepted = inspect.signature(backend_class).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        known = ", ".join(n for n in accepted if n != "dsn")
        raise ConfigurationError(
            f"{', '.join(unknown)}: not an option of the {scheme} backend (it takes {known})"
        )
