"""CPU time of a measured window: this process's, and the PostgreSQL server's when it runs here.

On a machine shared with other work a rate moves with the load, while CPU time
per unit of work moves much less; on two cores shared by the benchmark and the
server, it is also what decides the rate. The server's time is that of every
process of the postmaster the DSN reaches (read from ``/proc``), so measure
against a cluster of the benchmark's own: other sessions' work is counted too.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import anyio
import asyncpg

__all__ = ["CpuMeter"]


def _server_seconds(postmaster: int) -> float:
    """CPU seconds used so far by ``postmaster`` and its processes (those that exited too)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == postmaster:  # its own time and its exited children's
            total += sum(int(x) for x in fields[11:15])
        elif int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuMeter:
    """``await CpuMeter.of(dsn)``, then :meth:`start` and :meth:`stop` around the window."""

    postmaster: int | None
    client_seconds: float = 0.0
    server_seconds: float | None = None
    _client0: float = 0.0
    _server0: float | None = None

    @classmethod
    async def of(cls, dsn: str) -> CpuMeter:
        """A meter for the server ``dsn`` reaches (its time is not read when it runs elsewhere)."""
        conn = await asyncpg.connect(dsn)
        try:  # read while the backend is there: its parent is the postmaster
            pid = int(await conn.fetchval("SELECT pg_backend_pid()"))
            try:
                stat = await anyio.Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return cls(None)
        finally:
            await conn.close()
        return cls(int(stat.rsplit(")", 1)[1].split()[1]))

    def start(self) -> None:
        self._client0 = time.process_time()
        self._server0 = None if self.postmaster is None else _server_seconds(self.postmaster)

    def stop(self) -> None:
        self.client_seconds = time.process_time() - self._client0
        if self.postmaster is not None and self._server0 is not None:
            self.server_seconds = _server_seconds(self.postmaster) - self._server0

    def per(self, units: int) -> dict[str, float | None]:
        """Microseconds of CPU per unit of work: this process's, the server's and their sum."""
        client = self.client_seconds / units * 1e6
        server = None if self.server_seconds is None else self.server_seconds / units * 1e6
        return {
            "client_cpu_us": round(client, 1),
            "server_cpu_us": None if server is None else round(server, 1),
            "cpu_us": None if server is None else round(client + server, 1),
        }
