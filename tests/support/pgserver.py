"""A throwaway PostgreSQL server from the local binaries, for tests that need
their own (no shared DSN given, or a test that restarts the server)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        raise RuntimeError("no PostgreSQL binaries (pg_ctl) found on this machine")
    return Path(pg_ctl).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """initdb + pg_ctl on a free loopback port; as root, runs as user postgres."""

    def __init__(self, listen: tuple[str, ...] = ("127.0.0.1",)) -> None:
        self.listen = listen
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="eventbus-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self, trust: tuple[str, ...] = ()) -> PgServer:
        """initdb and start; clients from the ``trust`` networks connect as loopback ones do."""
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.writelines(f"host all all {cidr} trust\n" for cidr in trust)
        self._ctl("start")
        return self

    def start_standby_of(self, primary: PgServer) -> PgServer:
        """Start as a streaming replica of ``primary`` (``pg_basebackup -R``) on a port of its own."""
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(self.data), "-R", "-X", "stream", "--no-sync",
        )  # fmt: skip
        self._ctl("start")
        return self

    def promote(self) -> None:
        """Promote this standby to a primary and wait until it accepts writes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def _ctl(self, action: str, mode: str = "fast") -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses={','.join(self.listen)} -c fsync=off"
        args = ["pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "60"]
        if action == "start":
            self._run(*args, "-o", opts, "start")
        elif action == "stop":
            self._run(*args, "-m", mode, "stop")
        else:
            self._run(*args, "-m", mode, "-o", opts, "restart")

    def restart(self, mode: str = "fast") -> None:
        self._ctl("restart", mode)

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", mode)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("throwaway PostgreSQL did not come up")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.SubprocessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
