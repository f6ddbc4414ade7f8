"""The bus's own options of a PostgreSQL DSN: the pooler in front, the LISTEN DSN, the poll.

``postgresql://host:6432/db?pooler=transaction&listen_dsn=postgresql%3A%2F%2Fhost%3A5432%2Fdb``
names a transaction pooler (PgBouncer ``pool_mode = transaction``, or a
managed pooler that behaves like it) and a direct connection for LISTEN. The
options the bus reads are taken out of the DSN before it reaches the driver
(a pooler would refuse them as unknown startup parameters); everything else
in the query string is the driver's. Each option may also be given as a
keyword argument of the backend (``Bus(dsn, pooler="transaction")``), and
``listen_dsn`` as ``EVENTBUS_LISTEN_DSN``; given twice, the values must agree.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from typing import Literal, NamedTuple, TypeVar

from ...errors import ConfigurationError

__all__ = ["POOLERS", "PgOptions", "pg_options"]

T = TypeVar("T")

Pooler = Literal["none", "session", "transaction"]
POOLERS: tuple[Pooler, ...] = ("none", "session", "transaction")
"""What may sit between the bus and PostgreSQL: nothing, a session pooler, a transaction pooler."""

_OPTIONS = ("pooler", "pooler_prepared_statements", "listen_dsn", "poll_interval_seconds")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

DEFAULT_POLL_INTERVAL_SECONDS = 0.5
"""How often a worker that cannot LISTEN looks for work (a transaction pooler without ``listen_dsn``)."""


class PgOptions(NamedTuple):
    """The settings a PostgreSQL backend connects with."""

    dsn: str
    """The DSN handed to the driver: the given one without the bus's options."""
    pooler: Pooler
    pooler_prepared_statements: bool
    """The transaction pooler carries protocol-level prepared statements (PgBouncer >= 1.21)."""
    listen_dsn: str | None
    poll_interval_seconds: float

    @property
    def statement_cache(self) -> bool:
        """Whether pooled connections keep named prepared statements (asyncpg's statement cache).

        A transaction pooler hands each transaction whichever server
        connection is free, so a statement prepared on one is unknown (or,
        prepared by another client under the same name, already there) on the
        next, unless the pooler itself tracks prepared statements.
        """
        return self.pooler != "transaction" or self.pooler_prepared_statements

    @property
    def listen_target(self) -> str | None:
        """The DSN the LISTEN connection uses, or None to poll (a transaction pooler, no ``listen_dsn``)."""
        if self.listen_dsn is not None:
            return self.listen_dsn
        return None if self.pooler == "transaction" else self.dsn


def pg_options(
    dsn: str,
    *,
    pooler: str | None = None,
    pooler_prepared_statements: bool | None = None,
    listen_dsn: str | None = None,
    poll_interval_seconds: float | None = None,
) -> PgOptions:
    """The backend's settings from the DSN's options, the keyword arguments and the environment."""
    driver_dsn, found = _split(dsn)
    chosen = _pooler(_agree("pooler", pooler, found.get("pooler"), "none"))
    prepared = _agree(
        "pooler_prepared_statements",
        pooler_prepared_statements,
        _flag(found.get("pooler_prepared_statements")),
        False,
    )
    listen = _agree("listen_dsn", listen_dsn, found.get("listen_dsn"), None)
    listen = listen or os.environ.get("EVENTBUS_LISTEN_DSN") or None
    poll = _agree(
        "poll_interval_seconds", poll_interval_seconds, _seconds(found), DEFAULT_POLL_INTERVAL_SECONDS
    )
    if not math.isfinite(poll) or poll <= 0:
        raise ConfigurationError(f"poll_interval_seconds must be a finite number above zero; got {poll}")
    if listen is not None:
        _check_listen_dsn(listen)
    return PgOptions(driver_dsn, chosen, prepared, listen, poll)


def _split(dsn: str) -> tuple[str, dict[str, str]]:
    """The DSN without the bus's options, and those options by name."""
    scheme, sep, rest = dsn.partition("?")
    if not sep:
        return dsn, {}
    try:
        pairs = urllib.parse.parse_qsl(rest, keep_blank_values=True)
    except ValueError as exc:
        raise ConfigurationError(f"invalid PostgreSQL DSN: malformed options ({exc})") from exc
    ours = [(k, v) for k, v in pairs if k in _OPTIONS]
    if not ours:
        return dsn, {}
    found: dict[str, str] = {}
    for name, value in ours:
        if name in found:
            raise ConfigurationError(f"invalid PostgreSQL DSN: option {name!r} is repeated")
        found[name] = value
    theirs = urllib.parse.urlencode([(k, v) for k, v in pairs if k not in _OPTIONS])
    return (f"{scheme}?{theirs}" if theirs else scheme), found


def _pooler(value: str) -> Pooler:
    for known in POOLERS:
        if value == known:
            return known
    raise ConfigurationError(f"pooler must be one of {', '.join(POOLERS)}; got {value!r}")


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ConfigurationError(f"pooler_prepared_statements must be true or false; got {value!r}")


def _seconds(found: dict[str, str]) -> float | None:
    value = found.get("poll_interval_seconds")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigurationError(
            f"poll_interval_seconds must be a number of seconds; got {value!r}"
        ) from None


def _check_listen_dsn(listen_dsn: str) -> None:
    """A LISTEN DSN is a plain, direct DSN: no bus options (it must not go through a pooler)."""
    if not listen_dsn.startswith(("postgresql://", "postgres://")):
        raise ConfigurationError(
            f"listen_dsn must be a postgresql:// DSN; got {listen_dsn.split(':', 1)[0]!r}"
        )
    if _split(listen_dsn)[1]:
        raise ConfigurationError(
            "listen_dsn takes no bus options (pooler, listen_dsn, ...): "
            "it names a direct connection to PostgreSQL, not through a transaction pooler"
        )


def _agree(name: str, argument: T | None, from_dsn: T | None, default: T) -> T:
    """One option from the keyword argument or the DSN; both must agree when both are given."""
    if argument is not None and from_dsn is not None and argument != from_dsn:
        raise ConfigurationError(
            f"{name} is {from_dsn!r} in the DSN but {argument!r} as an argument: give it once"
        )
    if argument is not None:
        return argument
    return from_dsn if from_dsn is not None else default
