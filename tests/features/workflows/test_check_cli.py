"""``eventbus workflow check`` against a changed table, on both backends."""

from __future__ import annotations

import subprocess

from tests.apps.drift_app import Hold, shaped

from ...conftest import Target
from ...support.cli import run_cli
from ._support import run_until, status_is

APP = ["workflow", "--app", "tests.apps.drift_app:bus", "check"]


def check(target: Target, shape: str, *, ok: bool) -> subprocess.CompletedProcess[str]:
    result = run_cli(APP, {**target.env(), "DRIFT_SHAPE": shape})
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


async def test_check_reports_what_changed_and_fails_on_instances_in_gone_states(target: Target) -> None:
    bus = target.bus()
    v1 = shaped("")
    bus.include(v1)
    try:
        await bus.migrate()
        await bus.workflows.start(v1, Hold(key="h1"))
        await run_until(bus, lambda: status_is(bus, v1, "h1", "waiting"))  # its worker records v1
    finally:
        await bus.aclose()

    clean = check(target, "", ok=True)
    assert clean.stdout == "ok: every live instance is in a state its machine declares\n"

    edges = check(target, "edges", ok=True).stdout.splitlines()
    assert edges[0].startswith("shape: the table changed (") and "in force ->" in edges[0]
    assert "  states added: RETRY" in edges
    assert "  changed HOLD: success, failure DONE [yields] -> success DONE, failure RETRY [yields]" in edges
    assert edges[-3].split() == ["MACHINE", "STATE", "STATUS", "COUNT", "VERDICT", "DETAIL"]
    assert edges[-2].split()[:5] == ["shape", "HOLD", "waiting", "1", "changed"]
    assert edges[-1].startswith("ok:")

    removed = check(target, "removed", ok=False)
    assert "  states removed: HOLD" in removed.stdout.splitlines()
    assert "shape                HOLD                 waiting                1  gone" in removed.stdout
    assert removed.stderr.strip().splitlines() == [
        "Error: 1 problem(s): live instances in states their table no longer has "
        "(declare renamed={'OLD': 'NEW'} or repoint them)"
    ]

    renamed = check(target, "renamed", ok=True).stdout
    assert "  states renamed: HOLD -> KEEP" in renamed and "renamed  the next visit runs KEEP" in renamed
