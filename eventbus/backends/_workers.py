"""Which workers are lost: the rule both backends' rescue applies to the rows they read.

A worker is lost when its last heartbeat is older than the threshold (by the
database's clock on PostgreSQL, by this host's on SQLite, whose workers share
one host), or when it reported from this host under a process id that no
longer exists here. A process id that exists is taken as the worker's own
(a reused id only postpones the rescue to the heartbeat rule); this process is
never lost to itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .ports import Rescue

__all__ = ["lost_workers", "process_exists", "rescues_of"]


def process_exists(pid: int) -> bool:
    """Whether a process with this id exists on this host (signal 0 probes without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


Lost = dict[str, tuple[Any, str]]
"""Lost workers by id: the row read (id, hostname, pid, silent, by name) and the reason."""


def lost_workers(candidates: Iterable[Any], silent_seconds: float, hostname: str) -> Lost:
    """The lost workers among ``candidates`` (rows of id, hostname, pid, silent), with the reason."""
    lost: Lost = {}
    for row in candidates:
        if row["silent"] >= silent_seconds:
            lost[str(row["id"])] = (row, "silent")
        elif row["hostname"] == hostname and row["pid"] != os.getpid() and not process_exists(row["pid"]):
            lost[str(row["id"])] = (row, "process gone")
    return lost


def rescues_of(lost: Lost, taken: Mapping[str, int]) -> list[Rescue]:
    """One :class:`Rescue` per lost worker that had deliveries taken back (``taken``: counts by id)."""
    return [
        Rescue(
            worker_id=worker_id,
            hostname=row["hostname"],
            pid=row["pid"],
            silent_seconds=float(row["silent"]),
            reason=reason,
            deliveries=taken[worker_id],
        )
        for worker_id, (row, reason) in lost.items()
        if taken.get(worker_id)
    ]
