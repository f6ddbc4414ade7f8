"""Named SQL blocks, parsed once per backend.

A ``.sql`` file holds blocks introduced by ``-- name: NAME`` lines. The schema
placeholder ``{schema}`` is replaced by a validated, quoted identifier; nothing
else is ever spliced into SQL.
"""

from __future__ import annotations

import re
from importlib import resources

from .._priority import MAX_PRIORITY
from ..errors import ConfigurationError

__all__ = [
    "contains_like", "load_queries", "message_like", "query_names", "quote_schema", "validate_schema",
    "with_priority_step",
]  # fmt: skip

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NAME_RE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_FRAGMENT_RE = re.compile(r"\{(_\w+)\}")
_PLACEHOLDER_RE = re.compile(r"<(?:n|id|uuid|hex|str)>")


def _escape_like(text: str) -> str:
    """``text`` taken literally by LIKE with ``\\`` as its escape character."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def contains_like(text: str | None) -> str | None:
    """The LIKE pattern of "contains ``text``" (an empty ``text``: any value at all, never NULL)."""
    return None if text is None else f"%{_escape_like(text)}%"


def message_like(pattern: str | None) -> str | None:
    """The LIKE pattern of a normalised error: each placeholder (``<n>``, ``<id>``, ``<uuid>``,
    ``<hex>``, ``<str>``) matches any text, the rest itself; a trailing ``…`` any rest."""
    if pattern is None:
        return None
    cut = pattern.endswith("…")
    parts = _PLACEHOLDER_RE.split(pattern[:-1] if cut else pattern)
    return "%".join(_escape_like(p) for p in parts) + ("%" if cut else "")


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
    order; a name defined twice, in one file or in two, is refused. A block
    whose name starts with ``_`` is a fragment, not a query: another block
    includes it as ``{_name}`` (the delivery filter shared by the list, the
    count and the id walks), and one that names no defined fragment is refused.
    """
    folder = resources.files(f"eventbus.backends.{backend}").joinpath("queries")
    blocks: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME_RE.split(entry.read_text("utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in blocks:
                raise ConfigurationError(f"query {name!r} is defined twice in {backend}/queries")
            blocks[name] = body.strip().rstrip(";")
    return assemble(blocks, schema, f"{backend}/queries")


def query_names(backend: str, file: str) -> set[str]:
    """The names of the blocks of one ``eventbus/backends/<backend>/queries/`` file."""
    folder = resources.files(f"eventbus.backends.{backend}").joinpath("queries")
    return set(_NAME_RE.findall(folder.joinpath(file).read_text("utf-8")))


def assemble(blocks: dict[str, str], schema: str, where: str) -> dict[str, str]:
    """The queries of ``blocks`` (name to SQL), each fragment ``{_name}`` included and the schema quoted."""
    fragments = {name: _uncommented(body) for name, body in blocks.items() if name.startswith("_")}

    def include(match: re.Match[str]) -> str:
        if match.group(1) not in fragments:
            raise ConfigurationError(f"no fragment {match.group(1)!r} in {where}")
        return _FRAGMENT_RE.sub(include, fragments[match.group(1)])  # a fragment may include others

    return {
        name: render(_FRAGMENT_RE.sub(include, body), schema)
        for name, body in blocks.items()
        if not name.startswith("_")
    }


def _uncommented(body: str) -> str:
    """A fragment's SQL without its leading comment lines (they describe it where it is defined)."""
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--")).strip()


def with_priority_step(queries: dict[str, str], step_seconds: float) -> dict[str, str]:
    """The queries with the priority step written in: ``{priority_step}`` and ``{max_priority_wait}``.

    For a backend whose units of work take only the queries (SQLite): the
    step, a checked float, is part of the statement text.
    """
    step, widest = repr(float(step_seconds)), repr(float(step_seconds * MAX_PRIORITY))
    return {
        name: sql.replace("{priority_step}", step).replace("{max_priority_wait}", widest)
        for name, sql in queries.items()
    }
