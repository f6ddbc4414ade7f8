"""Hosts for multi-host tests: network namespaces, each reaching the test's server over a veth pair.

Every namespace, link and address here is created by the test and removed by
it (deleting a namespace removes its links). Host ``i`` has the address
``10.<net>.<i>.2`` in its namespace; its gateway (the server's side, in the
test's own namespace) is ``10.<net>.<i>.1``. ``<net>`` is drawn at random
from a private range that nothing else on the machine uses. Needs root.
"""

from __future__ import annotations

import os
import random
import subprocess
import uuid


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """``count`` namespaces named ``eb<tag>h<i>``, each with a veth pair to this namespace."""

    def __init__(self, count: int) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("multi-host tests create network namespaces: run them as root (CI does)")
        self.tag = uuid.uuid4().hex[:6]
        self.net = random.randint(200, 250)
        self.count = count
        self.created: list[str] = []

    def name(self, i: int) -> str:
        return f"eb{self.tag}h{i}"

    def gateway(self, i: int) -> str:
        """The address host ``i`` reaches the server at."""
        return f"10.{self.net}.{i}.1"

    @property
    def cidr(self) -> str:
        return f"10.{self.net}.0.0/16"

    def create(self) -> Hosts:
        for i in range(1, self.count + 1):
            ns, outer, inner = self.name(i), f"eb{self.tag}o{i}", f"eb{self.tag}i{i}"
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("addr", "add", f"{self.gateway(i)}/24", "dev", outer)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"10.{self.net}.{i}.2/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        return self

    def command(self, i: int, argv: list[str], hostname: str) -> list[str]:
        """``argv`` run in host ``i``'s namespace under its own host name (same pid: every step execs)."""
        script = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.name(i), "unshare", "--uts", "sh", "-c", script, hostname, *argv]

    def cut(self, i: int) -> None:
        """Cut host ``i`` off: its link goes down; packets are dropped, nothing is refused."""
        _ip("link", "set", f"eb{self.tag}o{i}", "down")

    def remove(self) -> None:
        for ns in self.created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.created.clear()
