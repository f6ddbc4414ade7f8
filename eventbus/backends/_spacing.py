"""Spacing a costly look by what it costs.

A look from the start of an index (a claim, a lease sweep) is cheap while
vacuum cleans dead entries away and grows with them while a long transaction
holds back the xmin horizon. :class:`Spaced` keeps such a look to about
``1/share`` of the time and makes it at least every ``every`` seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Spaced"]


@dataclass
class Spaced:
    every: float
    share: float = 20
    due_at: float = -math.inf  # made in any case from then
    allowed_at: float = -math.inf  # may be made, when there is reason to, from then

    def ran(self, started: float, ended: float) -> None:
        cost = ended - started
        self.allowed_at = ended + self.share * cost
        self.due_at = ended + max(self.every, self.share * cost)
