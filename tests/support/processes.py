"""Real processes for the crash and fault tests: started, signalled and always reaped.

A test starts every process through a :class:`ProcessGroup` and closes it in a
``finally`` block (or a fixture): SIGCONT and SIGTERM, then SIGKILL after a
short wait, and only for the processes it started, by pid.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVENTBUS = str(Path(sys.executable).parent / "eventbus")


class Proc:
    def __init__(self, popen: subprocess.Popen[bytes], log: Path, name: str) -> None:
        self.popen = popen
        self.log = log
        self.name = name

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout`` (blocks)."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    async def wait_async(self, timeout: float) -> int | None:
        """As :meth:`wait`, without blocking the event loop."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.popen.poll()
            if rc is not None:
                return rc
            await asyncio.sleep(0.05)
        return self.popen.poll()

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class ProcessGroup:
    """The processes one test started."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.all: list[Proc] = []

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        # Four test processes run at once, each starting several workers: pools of four
        # keep them within the shared server's max_connections (100).
        env.setdefault("EVENTBUS_MAX_POOL_SIZE", "4")
        env.update(extra or {})
        return env

    def spawn(
        self, cmd: list[str], env: dict[str, str] | None, name: str, split_stdout: bool = False
    ) -> Proc:
        """Start ``cmd``; stderr (and stdout unless split to ``<log>.out``) go to a log."""
        log = self.logdir / f"{name}-{len(self.all)}.log"
        with open(log, "wb") as err, open(log.with_suffix(".out"), "wb") as out:
            popen = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=self.env(env),
                stdout=out if split_stdout else err,
                stderr=err,
            )
        proc = Proc(popen, log, name)
        self.all.append(proc)
        return proc

    def _terminate_all(self) -> None:
        for p in self.all:
            if p.alive():
                try:
                    os.kill(p.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def close(self, grace: float = 5.0) -> None:
        self._terminate_all()
        deadline = time.monotonic() + grace
        for p in self.all:
            p.wait(max(0.0, deadline - time.monotonic()))
        for p in self.all:
            if p.alive():
                p.kill()

    async def aclose(self, grace: float = 5.0) -> None:
        self._terminate_all()
        deadline = time.monotonic() + grace
        for p in self.all:
            await p.wait_async(max(0.0, deadline - time.monotonic()))
        for p in self.all:
            if p.alive():
                p.kill()
