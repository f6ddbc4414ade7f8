"""The audit trail: every operator action, from the dashboard or the command line, kept in a table.

Each row says who acted (the operator's name), from where (the remote
address on the dashboard, ``user@host`` on the command line), what they did
(:data:`ACTIONS`), on what (a subscription, ``machine/key``, a schedule, an
approval or delivery ids), with which filter, how many rows it affected, when
(the database's clock) and through which interface. An action that is one
store call (``bus.cancel`` and the subscription moves, given ``audit=Actor(...)``)
writes its row in its own transaction; ``bus.audit.record`` writes one right
after any other action with the count it returned;
``bus.audit.entries`` reads them newest first, paged by keyset on the id.
Retention deletes rows older than ``Retention.audit_retention``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import msgspec

from .backends.ports import Operator
from .errors import ConfigurationError

__all__ = ["ACTIONS", "MAX_AUDIT_ROWS", "Actor", "Audit", "AuditEntry", "Interface"]

ACTIONS = (
    "approve", "cancel", "deny", "pause", "purge", "release", "remove", "repoint", "replay", "resolve",
    "resume", "retry", "trigger",
)  # fmt: skip
"""The actions the trail records (the filter of ``entries`` accepts only these)."""
MAX_AUDIT_ROWS = 1000
"""The most rows one read returns."""
MAX_TEXT = 2000
"""Longer texts (a filter, a list of ids) are cut to this many characters."""
Interface = Literal["dashboard", "cli"]


def _entry(
    action: str, target: str, actor: str, origin: str, interface: str, filter: str | None
) -> dict[str, Any]:
    """A checked audit row without its count."""
    if action not in ACTIONS:
        raise ConfigurationError(f"unknown audit action {action!r}: one of {', '.join(ACTIONS)}")
    if interface not in ("dashboard", "cli"):
        raise ConfigurationError(f"interface must be dashboard or cli, got {interface!r}")
    return {
        "action": action, "target": _cut(target), "actor": _cut(actor) or "?",
        "origin": _cut(origin) or "?", "interface": interface, "filter": _cut(filter),
    }  # fmt: skip


class Actor(msgspec.Struct, frozen=True):
    """Who acts: given as ``audit=`` to an action, it records itself in the action's own transaction."""

    name: str
    """The operator's name."""
    origin: str
    """The remote address (dashboard) or ``user@host`` (command line)."""
    interface: Interface

    def entry(self, action: str, target: str, filter: str | None = None) -> dict[str, Any]:
        """The row ``action`` on ``target`` writes (the store adds the count)."""
        return _entry(action, target, self.name, self.origin, self.interface, filter)


class AuditEntry(msgspec.Struct, frozen=True):
    """One operator action."""

    id: int
    at: datetime
    actor: str
    """The operator's name."""
    origin: str
    """The remote address (dashboard) or ``user@host`` (command line)."""
    action: str
    target: str
    """What it acted on: ``subscription orders``, ``machine orders/k1``, ``deliveries 1, 2``, …"""
    filter: str | None
    count: int | None
    """How many rows it affected, when the action says."""
    interface: str


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT:
        return text
    return text[: MAX_TEXT - 1] + "…"


def check_filter(action: str | None, actor: str | None, limit: int) -> None:
    """A :class:`ConfigurationError` for an unknown action, an empty actor or a limit out of range."""
    if action is not None and action not in ACTIONS:
        raise ConfigurationError(f"unknown audit action {action!r}: one of {', '.join(ACTIONS)}")
    if actor is not None and not actor.strip():
        raise ConfigurationError("the audit actor filter cannot be empty")
    if not 1 <= limit <= MAX_AUDIT_ROWS:
        raise ConfigurationError(f"an audit read returns 1 to {MAX_AUDIT_ROWS} rows, got {limit}")


class Audit:
    """``bus.audit``: record operator actions and read them back."""

    def __init__(self, store: Callable[[], Operator]) -> None:
        self._store = store

    async def record(
        self,
        action: str,
        target: str,
        *,
        actor: str,
        origin: str,
        interface: Interface,
        count: int | None = None,
        filter: str | None = None,
    ) -> int:
        """Write one row for an action just taken; returns its id."""
        entry = _entry(action, target, actor, origin, interface, filter)
        return await self._store().record_audit({**entry, "count": count})

    async def entries(
        self,
        *,
        limit: int = 50,
        action: str | None = None,
        actor: str | None = None,
        before: int | None = None,
    ) -> list[AuditEntry]:
        """The newest ``limit`` rows (below the id ``before``: the next page); ``action``, ``actor`` exact."""
        check_filter(action, actor, limit)
        rows = await self._store().audit_entries(limit=limit, action=action, actor=actor, before=before)
        return [msgspec.convert(r, AuditEntry) for r in rows]
