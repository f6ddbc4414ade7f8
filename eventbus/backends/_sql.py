"""Named SQL blocks, parsed once per backend.

A ``.sql`` file holds blocks introduced by ``-- name: NAME`` lines. The schema
placeholder ``{schema}`` is replaced by a validated, quoted identifier; nothing
else is ever spliced into SQL.
"""

from __future__ import annotations

import re
from importlib import resources

from ..errors import ConfigurationError

__all__ = ["load_queries", "quote_schema", "validate_schema"]

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NAME_RE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a plain lower-case identifier PostgreSQL accepts, else raise.

    At most 63 characters (longer identifiers are truncated by PostgreSQL), and
    not ``pg_…``, which PostgreSQL reserves for system schemas.
    """
    if not _SCHEMA_RE.match(schema):
        raise ConfigurationError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and _ "
            "(at most 63 characters, not starting with a digit)"
        )
    if schema.startswith("pg_"):
        raise ConfigurationError(f"invalid schema name {schema!r}: PostgreSQL reserves the prefix pg_")
    return schema


def quote_schema(schema: str) -> str:
    """Return the validated schema as a quoted SQL identifier."""
    return '"' + validate_schema(schema) + '"'


def render(sql: str, schema: str) -> str:
    """Substitute the quoted schema into one SQL text."""
    return sql.replace("{schema}", quote_schema(schema))


def load_queries(backend: str, schema: str) -> dict[str, str]:
    """Parse the named blocks of every ``eventbus/backends/<backend>/queries/*.sql`` file.

    One file per port (``delivery.sql``, ``inspect.sql``, …), read in name
    order; a name defined twice, in one file or in two, is refused.
    """
    folder = resources.files(f"eventbus.backends.{backend}").joinpath("queries")
    queries: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME_RE.split(entry.read_text("utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise ConfigurationError(f"query {name!r} is defined twice in {backend}/queries")
            queries[name] = render(body.strip().rstrip(";"), schema)
    return queries
