"""The checkpoint of the per-customer model retraining machine."""

from __future__ import annotations

import msgspec


class Retrain(msgspec.Struct):
    """What one retraining run remembers between visits (committed with every transition)."""

    customer: str
    job_id: str | None = None
    resumed: bool = False
    model: str | None = None
