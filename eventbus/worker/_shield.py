"""Shielded work that a hard stop can still cut off.

The worker's own claim and result transactions run shielded, so a graceful
stop never loses a claim or rolls back a completion whose handler already ran.
A hard stop (a second signal) must still end within about a second even when
the database does not answer: it gives everything shielded, running now or
started later, one short common deadline. What was not written by then stays
covered by its lease.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

__all__ = ["Shield"]

ABORT_SECONDS = 0.5
"""How long shielded work may still take after a hard stop."""


class Shield:
    """Hands out shielded cancel scopes; :meth:`abort` puts a deadline on all of them."""

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self._deadline = math.inf

    @property
    def aborted(self) -> bool:
        return self._deadline < math.inf

    @contextmanager
    def __call__(self, deadline: float = math.inf) -> Iterator[anyio.CancelScope]:
        """A shielded scope, cut off at ``deadline`` (event-loop time) or by :meth:`abort`."""
        with anyio.CancelScope(shield=True, deadline=min(deadline, self._deadline)) as scope:
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    def abort(self, seconds: float = ABORT_SECONDS) -> None:
        """Give shielded work, running or still to come, ``seconds`` more at most."""
        self._deadline = min(self._deadline, anyio.current_time() + seconds)
        for scope in self._scopes:
            scope.deadline = min(scope.deadline, self._deadline)
