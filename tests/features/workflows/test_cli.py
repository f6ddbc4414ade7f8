"""``eventbus workflow`` end to end on the example application, and the diagram golden files."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from eventbus.workflows import MAX_RETRIES, diagram
from handlers.retrain import machine
from schemas import Retrain

from ...conftest import Target
from ...support.cli import run_cli

GOLDEN = Path(__file__).parent / "golden"
SVG = "{http://www.w3.org/2000/svg}"
APP = ["workflow", "--app", "handlers.app:bus"]


def eventbus(target: Target, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = run_cli(args, target.env())
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    if not ok:
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            result.stderr
        )
    return result


def test_the_diagram_is_the_table() -> None:
    mermaid = diagram(machine, "mermaid")
    assert mermaid == (GOLDEN / "retrain.mmd").read_text()
    assert diagram(machine, "dot") == (GOLDEN / "retrain.dot").read_text()
    for state in machine.states.values():
        for target in {state.on_success, state.on_failure, *state.also}:
            assert f"    {state.name} --> {target} : " in mermaid
        if state.max_visits:
            assert f"    {state.name} : max {state.max_visits} visits" in mermaid
            assert f"    {state.name} --> {MAX_RETRIES} : cap" in mermaid
    assert "    POLL_JOB : yields, poll 3m" in mermaid and "wakes on gpu.job_finished" in mermaid


async def test_workflow_commands(target: Target) -> None:
    bus = target.bus()
    bus.include(machine)
    try:
        await bus.migrate()
        await bus.workflows.start(machine, Retrain(customer="acme"))
    finally:
        await bus.aclose()
    assert "acme" in eventbus(target, *APP, "list", "retrain", "--status", "pending").stdout
    assert eventbus(target, *APP, "show", "retrain", "acme").stdout.startswith(
        "retrain/acme: INITIAL (pending)"
    )
    refused = eventbus(target, *APP, "repoint", "retrain", "acme", "--to", "DONE", "--reason", "x",
                       "--expect", "SUBMIT_JOB", ok=False)  # fmt: skip
    assert "GuardMismatch: retrain/acme is in INITIAL, not SUBMIT_JOB" in refused.stderr
    eventbus(target, *APP, "repoint", "retrain", "acme", "--to", "DONE", "--reason", "no data yet",
             "--expect", "INITIAL", "--by", "ann")  # fmt: skip
    shown = eventbus(target, *APP, "show", "retrain", "acme").stdout
    assert "repoint -> DONE by operator:ann (no data yet)" in shown and "DONE (completed)" in shown
    assert "cannot pause" in eventbus(target, *APP, "pause", "retrain", "acme", ok=False).stderr
    live = eventbus(target, *APP, "diagram", "retrain", "--live").stdout
    assert "    DONE : [1 completed]" in live
    assert (
        eventbus(target, *APP, "diagram", "retrain", "--format", "dot").stdout
        == (GOLDEN / "retrain.dot").read_text()
    )
    drawn = ET.fromstring(eventbus(target, *APP, "diagram", "retrain", "--format", "svg", "--live").stdout)
    done = [g for g in drawn.iter(f"{SVG}g") if (g.get("class") or "").startswith("md-box terminal")]
    assert any("DONE: 1 run(s) here (1 completed)" in "".join(g.itertext()) for g in done)
    assert eventbus(target, *APP, "check").stdout.startswith("ok:")
    assert "UnknownMachine" in eventbus(target, *APP, "list", "nope", ok=False).stderr
    assert "UnknownApproval" in eventbus(target, *APP, "approve", "999", "--by", "x", ok=False).stderr
    assert "--app" in eventbus(target, "workflow", "list", "retrain", ok=False).stderr


def test_the_example_runs_end_to_end_on_the_sqlite_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTBUS_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    out = subprocess.run(
        [sys.executable, "-m", "handlers"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "published 3 new orders" in text and "dead-letter delivery" in text
    assert "globex: the download crashed in run 1; run 2 resumes it" in text
    assert "  run 2 CHECK_LAST_TRAIN  visit 1   ok     -> DOWNLOAD_SAVE" in text
    assert "initech: MAX_RETRIES (failed), run 1" in text
    assert "last error: max retries reached: SUBMIT_JOB visited 3 times" in text
    assert "GPU jobs submitted: acme, globex, initech, initech, initech (globex: 1 job for two runs)" in text
    assert (GOLDEN / "retrain.mmd").read_text() in text
    assert "holiday: DONE (completed), thumbnails {'beach.jpg': '64px'" in text
    assert "{'sunset.corrupt': 'ValueError: sunset.corrupt is not an image'}" in text
    assert "IMPORT visited 2 times" in text and "IMPORT --> child_thumbnail : starts, waits" in text
    assert (tmp_path / "eventbus.db").exists()


async def test_a_bus_including_the_application_runs_its_machines() -> None:
    from eventbus.testing import drain, temporary_bus
    from handlers.app import bus as app
    from handlers.gpu import gpu

    gpu.script("hooli", "succeeded", polls=1)
    async with temporary_bus(router=app) as bus:
        assert (
            "retrain" in bus.workflows.machines
            and bus.subscriptions["wf.retrain"].handler != app.subscriptions["wf.retrain"].handler
        )
        await bus.workflows.start("retrain", Retrain(customer="hooli"))
        await drain(bus)
        inst = await bus.workflows.instance("retrain", "hooli")
        assert inst.state == "DONE" and (inst.checkpoint.model or "").startswith("model of hooli")
