"""``eventbus dashboard``: one clear line when the extra is missing or the database is not ready;
actions logged by default with the real client; only the bound host names served."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx

from eventbus import Bus
from eventbus.cli.dashboard import allowed_hosts_for

from ...support.processes import EVENTBUS, Proc, ProcessGroup
from .conftest import TOKEN

FORGED = "203.0.113.9"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BLOCK_WEB_EXTRA = """
import importlib.util, sys
_find = importlib.util.find_spec
_web = ('starlette', 'jinja2', 'uvicorn')
importlib.util.find_spec = lambda n, *a: None if n.split('.')[0] in _web else _find(n, *a)
from eventbus.cli import main
sys.argv = ['eventbus'] + sys.argv[1:]
main()
"""


def _run(args: list[str], tmp_path: Path, code: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = (
        [sys.executable, "-c", code, *args]
        if code
        else [str(Path(sys.executable).with_name("eventbus")), *args]
    )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_missing_extra_is_one_line(tmp_path: Path) -> None:
    r = _run(["--dsn", f"sqlite:///{tmp_path / 'x.db'}", "dashboard"], tmp_path, BLOCK_WEB_EXTRA)
    assert r.returncode != 0
    assert r.stderr.strip() == "Error: the dashboard needs the web extra: pip install 'eventbus[web]'"


def test_a_bad_app_is_one_line(tmp_path: Path) -> None:
    for app, says in [("nosuch:bus", "cannot import 'nosuch'"), ("os:path", "is not an eventbus.Bus")]:
        r = _run(["--dsn", f"sqlite:///{tmp_path / 'x.db'}", "dashboard", app], tmp_path)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("Error: ConfigurationError:") and says in line


def test_an_unmigrated_database_is_refused_before_serving(tmp_path: Path) -> None:
    r = _run(["--dsn", f"sqlite:///{tmp_path / 'x.db'}", "dashboard", "--port", "1"], tmp_path)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "SchemaNotMigrated" in lines[0] and "Traceback" not in r.stderr


async def _dashboard(group: ProcessGroup, dsn: str, *options: str) -> tuple[Proc, str]:
    """``eventbus dashboard`` with a token on a free port, once it answers."""
    port = _free_port()
    cmd = [EVENTBUS, "--dsn", dsn, "dashboard", "--token", TOKEN, "--port", str(port), *options]
    proc = group.spawn(cmd, {}, "dashboard")
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        with anyio.fail_after(30):
            while True:
                assert proc.alive(), proc.output()
                try:
                    await client.get(url + "/static/dashboard.js")  # any answer: it is serving
                    return proc, url
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)


async def _act_as_forwarded(url: str) -> None:
    """A purge of nothing, posted by a client claiming to be another address."""
    headers = {"Origin": url, "X-Dashboard-Token": TOKEN, "X-Forwarded-For": FORGED}
    async with httpx.AsyncClient() as client:
        form = {"op": "purge", "scope": "filter", "confirm": "yes"}
        r = await client.post(url + "/dead/action", data=form, headers=headers)
        assert r.status_code == 303, r.text


async def _action_line(proc: Proc) -> str:
    with anyio.fail_after(30):
        while "dashboard action by" not in proc.output():
            await anyio.sleep(0.05)
    (line,) = [x for x in proc.output().splitlines() if "dashboard action by" in x]
    return line


async def test_actions_are_logged_by_default_with_the_real_client(tmp_path: Path) -> None:
    """At the default log level (WARNING), and with X-Forwarded-For trusted from no proxy unless named."""
    dsn = f"sqlite:///{tmp_path / 'bus.db'}"
    bus = Bus(dsn)
    await bus.migrate()
    await bus.aclose()
    group = ProcessGroup(tmp_path)
    try:
        proc, url = await _dashboard(group, dsn, "--operator", "night-shift")
        await _act_as_forwarded(url)
        line = await _action_line(proc)
        assert "night-shift (127.0.0.1)" in line and "purge" in line and FORGED not in line
        trusting, url = await _dashboard(group, dsn, "--forwarded-allow-ips", "127.0.0.1")
        await _act_as_forwarded(url)
        assert f"({FORGED})" in await _action_line(trusting)
    finally:
        await group.aclose()


async def test_the_bound_host_names_are_the_ones_accepted(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'bus.db'}"
    bus = Bus(dsn)
    await bus.migrate()
    await bus.aclose()
    group = ProcessGroup(tmp_path)
    try:
        _, url = await _dashboard(group, dsn)
        port = url.rsplit(":", 1)[1]
        async with httpx.AsyncClient() as client:
            assert (await client.get(url + "/")).status_code == 200
            assert (await client.get(f"http://localhost:{port}/")).status_code == 200
            rebound = await client.get(url + "/", headers={"Host": f"attacker.example:{port}"})
            assert rebound.status_code == 400
        _, url = await _dashboard(group, dsn, "--allowed-host", "ops.example")
        async with httpx.AsyncClient() as client:
            assert (await client.get(url + "/", headers={"Host": "ops.example"})).status_code == 200
            assert (await client.get(url + "/")).status_code == 400
    finally:
        await group.aclose()


def test_allowed_hosts_follow_the_bound_address() -> None:
    assert allowed_hosts_for("127.0.0.1", ()) == ["127.0.0.1", "localhost", "[::1]"]
    assert allowed_hosts_for("::1", ()) == ["[::1]", "localhost", "127.0.0.1"]
    assert allowed_hosts_for("10.1.2.3", ()) == ["10.1.2.3", "localhost", "127.0.0.1", "[::1]"]
    assert socket.gethostname() in allowed_hosts_for("0.0.0.0", ())
    assert allowed_hosts_for("0.0.0.0", ("a.example,b.example", "c.example")) == [
        "a.example", "b.example", "c.example",
    ]  # fmt: skip
