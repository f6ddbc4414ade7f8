"""A throwaway PgBouncer in front of the run's PostgreSQL, for the pooler tests.

Started from Debian's binary on a free loopback port with a config, an auth
file and a log of its own in a temporary folder; every database name is
forwarded to the server (``* =`` entry), so the per-process test database is
reached through it by name. Stopped by its own pid, never by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .pgserver import _free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

_CONFIG = """\
[databases]
* = host={host} port={port} user={user}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {root}/users.txt
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 500
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
ignore_startup_parameters = extra_float_digits
server_lifetime = 3600
; Each pytest worker runs a transaction and a session pooler for the whole run:
; idle server connections are closed after a few seconds, so the poolers of all
; pytest workers leave few server connections open between pooler tests.
server_idle_timeout = 5
"""


class PgBouncer:
    """One PgBouncer process in ``mode`` (``transaction`` or ``session``) in front of ``server_dsn``."""

    def __init__(self, server_dsn: str, mode: str, pool_size: int = 20) -> None:
        parts = urlsplit(server_dsn)
        self.server = parts
        self.mode = mode
        self.pool_size = pool_size
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"eventbus-pgbouncer-{mode}-"))
        self.popen: subprocess.Popen[bytes] | None = None

    def dsn_for(self, direct_dsn: str) -> str:
        """``direct_dsn`` (same server) reached through this PgBouncer instead: host and port replaced."""
        parts = urlsplit(direct_dsn)
        user = parts.username or "postgres"
        return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{self.port}"))

    def start(self) -> PgBouncer:
        user = self.server.username or "postgres"
        (self.root / "users.txt").write_text(f'"{user}" ""\n')
        config = _CONFIG.format(
            host=self.server.hostname or "127.0.0.1",
            port=self.server.port or 5432,
            user=user,
            listen_port=self.port,
            root=self.root,
            mode=self.mode,
            pool_size=self.pool_size,
        )
        (self.root / "pgbouncer.ini").write_text(config)
        self.root.chmod(0o755)
        cmd = [PGBOUNCER, str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root: it drops to postgres itself
            shutil.chown(self.root, "postgres", "postgres")
            cmd[1:1] = ["-u", "postgres"]
        self.popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_listening(timeout=20)
        return self

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self.popen is not None
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                err = self.popen.stderr.read().decode() if self.popen.stderr else ""
                raise RuntimeError(f"PgBouncer exited at start: {err or self.log()}")
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            time.sleep(0.05)
        raise TimeoutError(f"PgBouncer did not listen on port {self.port}: {self.log()}")

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        """SIGINT (PgBouncer's shutdown), then SIGKILL after a short wait; by our own pid only."""
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            os.kill(popen.pid, signal.SIGINT)
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)
        if popen is not None and popen.stderr is not None:
            popen.stderr.close()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_pgbouncer(server_dsn: str, mode: str) -> Iterator[PgBouncer]:
    """A started PgBouncer in ``mode``, stopped when the block ends."""
    bouncer = PgBouncer(server_dsn, mode)
    try:
        yield bouncer.start()
    finally:
        bouncer.stop()
