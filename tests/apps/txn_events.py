"""Event types of the transactional-handler app (importable without building a bus)."""

from __future__ import annotations

from eventbus import Event


class TxnJob(Event, event_type="txn.job"):
    n: int


class TxnFollowUp(Event, event_type="txn.followup"):
    n: int
