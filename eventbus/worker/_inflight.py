"""The claims a worker holds, each under its own lease token.

A delivery can be claimed again (by this worker too) once a lease it held ran
out; the old run's result is then refused. Keying by (delivery id, lease token)
means refusing or settling one run never touches another run's entry, so the
heartbeat keeps renewing the current claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..backends.base import ClaimedDelivery, LeaseKey
from ..router import Subscription
from ..types import DeliveryId

__all__ = ["Claim", "InFlight"]


@dataclass(slots=True)
class Claim:
    """One claimed delivery, from its claim until its result is written or refused."""

    sub: Subscription
    delivery: ClaimedDelivery

    @property
    def lease(self) -> LeaseKey:
        return (self.delivery.id, self.delivery.lease_token)


class InFlight:
    """Claims by (delivery id, lease token)."""

    def __init__(self) -> None:
        self._claims: dict[LeaseKey, Claim] = {}

    def add(self, sub: Subscription, delivery: ClaimedDelivery) -> None:
        self._claims[(delivery.id, delivery.lease_token)] = Claim(sub, delivery)

    def get(self, lease: LeaseKey) -> Claim | None:
        return self._claims.get(lease)

    def discard(self, lease: LeaseKey) -> None:
        self._claims.pop(lease, None)

    def pop(self, lease: LeaseKey) -> Claim | None:
        return self._claims.pop(lease, None)

    def __contains__(self, lease: object) -> bool:
        return lease in self._claims

    def __len__(self) -> int:
        return len(self._claims)

    def __iter__(self) -> Iterator[Claim]:
        return iter(list(self._claims.values()))

    def leases(self) -> dict[tuple[str, float], list[DeliveryId]]:
        """Delivery ids by (lease token, lease seconds): one renewal each."""
        groups: dict[tuple[str, float], list[DeliveryId]] = {}
        for claim in list(self._claims.values()):
            key = (claim.delivery.lease_token, claim.sub.lease_seconds)
            groups.setdefault(key, []).append(claim.delivery.id)
        return groups
