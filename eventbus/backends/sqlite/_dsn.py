"""What a SQLite DSN and the backend's keyword arguments name: the file and its settings.

``sqlite:///relative.db`` or ``sqlite:////abs.db``, optionally with
``?synchronous=NORMAL&busy_timeout_ms=5000``. An option given both in the DSN
and as a keyword argument must agree.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any, NamedTuple, TypeVar

from ..._priority import DEFAULT_PRIORITY_STEP_SECONDS, checked_priority_step
from ...errors import ConfigurationError

__all__ = ["SYNCHRONOUS", "DsnOptions", "Options", "options", "parse_dsn"]

T = TypeVar("T")

SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")
"""The ``PRAGMA synchronous`` levels a bus may run at."""
_DSN_OPTIONS = ("synchronous", "busy_timeout_ms")
_USAGE = (
    "use sqlite:///relative/path.db or sqlite:////absolute/path.db[?synchronous=NORMAL&busy_timeout_ms=5000]"
)


class DsnOptions(NamedTuple):
    """What a SQLite DSN names: the file and the options of its query string."""

    path: str
    synchronous: str | None = None
    busy_timeout_ms: int | None = None


class Options(NamedTuple):
    """The settings a backend runs with, from its DSN and keyword arguments."""

    path: str
    """The database file, absolute."""
    synchronous: str
    busy_timeout_ms: int
    poll_interval_seconds: float
    migrate: bool
    """Migrate on open instead of refusing a file that is missing or not migrated."""
    priority_step_seconds: float = DEFAULT_PRIORITY_STEP_SECONDS
    """The seconds of waiting a priority level is worth (see ``Bus``)."""

    @property
    def lock_deadline_seconds(self) -> float:
        """How long a call waits for another process's write lock: several busy timeouts."""
        return max(5.0, 4 * self.busy_timeout_ms / 1000)


def options(
    dsn: str,
    *,
    synchronous: str | None,
    busy_timeout_ms: int | None,
    poll_interval_seconds: float,
    migrate: bool,
    priority_step_seconds: float = DEFAULT_PRIORITY_STEP_SECONDS,
) -> Options:
    """The backend's settings: each option from the keyword argument or the DSN, checked."""
    parsed = parse_dsn(dsn)
    level = _agree("synchronous", synchronous and synchronous.upper(), parsed.synchronous, "FULL")
    timeout = _agree("busy_timeout_ms", busy_timeout_ms, parsed.busy_timeout_ms, 30000)
    if level not in SYNCHRONOUS:
        raise ConfigurationError("synchronous must be 'FULL', 'NORMAL' or 'EXTRA'")
    if timeout < 0:
        raise ConfigurationError("busy_timeout_ms cannot be negative")
    step = checked_priority_step(priority_step_seconds)
    return Options(parsed.path, level, timeout, poll_interval_seconds, migrate, step)


def _agree(name: str, argument: T | None, from_dsn: T | None, default: T) -> T:
    """One option from the keyword argument or the DSN; both must agree when both are given."""
    if argument is not None and from_dsn is not None and argument != from_dsn:
        raise ConfigurationError(
            f"{name} is {from_dsn!r} in the DSN but {argument!r} as an argument: give it once"
        )
    if argument is not None:
        return argument
    return from_dsn if from_dsn is not None else default


def parse_dsn(dsn: str) -> DsnOptions:
    """Parse ``sqlite:///relative.db`` or ``sqlite:////abs.db[?synchronous=NORMAL&busy_timeout_ms=5000]``.

    The path comes back absolute. Options are ``synchronous`` (``FULL``,
    ``NORMAL`` or ``EXTRA``) and ``busy_timeout_ms`` (a non-negative integer);
    anything else, a repeated option or a malformed value is refused.
    """
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme != "sqlite" or parts.netloc or parts.fragment:
        raise ConfigurationError(f"invalid SQLite DSN {dsn!r}: {_USAGE}")
    path = urllib.parse.unquote(parts.path[1:])
    if not path or path == ":memory:":
        raise ConfigurationError(
            f"invalid SQLite DSN {dsn!r}: name a file (an in-memory database cannot be "
            "shared by the connections and processes of a bus; use a temporary file)"
        )
    return DsnOptions(os.path.abspath(path), **_dsn_options(dsn, parts.query))


def _dsn_options(dsn: str, query: str) -> dict[str, Any]:
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ConfigurationError(f"invalid SQLite DSN {dsn!r}: malformed options ({exc})") from exc
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name not in _DSN_OPTIONS:
            raise ConfigurationError(
                f"invalid SQLite DSN {dsn!r}: unknown option {name!r} (known: {', '.join(_DSN_OPTIONS)})"
            )
        if name in found:
            raise ConfigurationError(f"invalid SQLite DSN {dsn!r}: option {name!r} is repeated")
        found[name] = _dsn_value(dsn, name, value)
    return found


def _dsn_value(dsn: str, name: str, value: str) -> str | int:
    if name == "synchronous":
        if value.upper() not in SYNCHRONOUS:
            raise ConfigurationError(f"invalid SQLite DSN {dsn!r}: synchronous must be FULL, NORMAL or EXTRA")
        return value.upper()
    if not value.isdigit():
        raise ConfigurationError(
            f"invalid SQLite DSN {dsn!r}: busy_timeout_ms must be a non-negative integer"
        )
    return int(value)
