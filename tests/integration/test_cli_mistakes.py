"""Command-line mistakes: names nothing has, ids no row can have, bad durations, bad apps and DSNs.

Each is refused with one ``Error:`` line and a non-zero exit, never a traceback
or a silent "0 done".
"""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from pathlib import Path

import asyncpg

from handlers.retrain import machine
from schemas import Retrain

from ..apps.cli_app import CliOrder
from ..apps.schedule_events import Beat
from ..conftest import BusFactory, Target
from .test_cli import APP, eventbus

TOO_BIG = str(2**63)
WORKFLOW = ("workflow", "--app", "handlers.app:bus")


def refused(target: Target, *args: str, message: str) -> None:
    result = eventbus(target, *args, check=False)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and message in errors[0], result.stderr


async def _sql(target: Target, query: str) -> None:
    if target.kind == "sqlite":
        with sqlite3.connect(target.dsn.removeprefix("sqlite:///")) as db:
            db.execute(query)
        return
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(f'SET search_path TO "{target.schema}"')
        await conn.execute(query)
    finally:
        await conn.close()


async def test_dlq_filters_that_name_nothing_are_refused(make_bus: BusFactory, target: Target) -> None:
    await make_bus()
    eventbus(target, "worker", APP, "--burst")  # registers cli.handle
    async with target.bus() as bus:
        await bus.publish(CliOrder(order_id="fail"))
        await bus.publish_raw("only.in.the.log", b"{}")
    eventbus(target, "worker", APP, "--burst")  # the order goes dead

    for command in (("list",), ("replay",), ("purge", "--yes")):
        refused(target, "dlq", *command, "--subscription", "cli.hadnle", message="no subscription named")
        refused(target, "dlq", *command, "--event-type", "cli.ordr", message="no event type 'cli.ordr'")
    refused(target, "dlq", "list", "--since", "3000000d", message="before the year 1")
    refused(target, "dlq", "list", "--since", "0001-01-01T00:00+14:00", message="before the year 1")

    # Names the database knows still work: an event type only the log has, a removed subscription.
    assert eventbus(target, "dlq", "list", "--event-type", "only.in.the.log", "--json").stdout.strip() == "[]"
    replay = eventbus(target, "dlq", "replay", "--event-type", "cli.order", "--dry-run").stdout
    assert replay.strip() == "would be replayed: 1"
    eventbus(target, "subscriptions", "remove", "cli.handle", "--yes")
    (dead,) = json.loads(eventbus(target, "dlq", "list", "--subscription", "cli.handle", "--json").stdout)
    assert dead["event_type"] == "cli.order"


async def test_workflow_list_refuses_a_status_or_state_that_does_not_exist(
    make_bus: BusFactory, target: Target
) -> None:
    bus = await make_bus()
    bus.include(machine)
    await bus.workflows.start(machine, Retrain(customer="acme"))
    await bus.workflows.start(machine, Retrain(customer="initech"))
    await _sql(target, "UPDATE wf_instances SET state = 'RETIRED' WHERE key = 'initech'")

    refused(target, *WORKFLOW, "list", "retrain", "--status", "pendign", message="'pendign' is not one of")
    refused(target, *WORKFLOW, "list", "retrain", "--state", "INTIAL", message="has no state 'INTIAL'")
    refused(target, *WORKFLOW, "list", "retrain", "--limit", "0", message="0 is not a count")
    listed = eventbus(target, *WORKFLOW, "list", "retrain", "--state", "INITIAL", "--status", "pending")
    assert "acme" in listed.stdout and "initech" not in listed.stdout
    # A state gone from the table that an instance is still in can be listed.
    assert "initech" in eventbus(target, *WORKFLOW, "list", "retrain", "--state", "RETIRED").stdout


async def test_ids_counts_and_durations_out_of_range_are_refused(
    make_bus: BusFactory, target: Target
) -> None:
    await make_bus()
    for args, message in (
        (("cancel", "1", TOO_BIG), "is not an id"),
        (("trace", TOO_BIG), "is not an id"),
        (("dlq", "show", TOO_BIG), "is not an id"),
        (("dlq", "replay", TOO_BIG), "is not an id"),
        (("dlq", "replay", "--all", "--batch-size", "0"), "0 is not a count"),
        (("dlq", "list", "--limit", TOO_BIG), "is not a count"),
        (("schedule", "show", "nightly", "--limit", "0"), "0 is not a count"),
        ((*WORKFLOW, "approve", TOO_BIG, "--by", "ann"), "is not an id"),
        ((*WORKFLOW, "sweep", "--grace", "nan"), "'nan' is not a finite number of seconds"),
        ((*WORKFLOW, "sweep", "--grace", "-1"), "'-1' is not a finite number of seconds"),
        (("bench", "--n", "0"), "0 is not a count"),
        (("bench", "--handler-sleep", "inf"), "'inf' is not a finite number of seconds"),
    ):
        refused(target, *args, message=message)


async def test_backfill_past_the_representable_dates_is_refused(make_bus: BusFactory, target: Target) -> None:
    bus = await make_bus()
    bus.schedule("beat", Beat, every=timedelta(minutes=1))
    await bus.schedules.declare()
    window = ("--from", "0001-01-01T00:00:00+14:00", "--to", "0001-01-01T00:00:00Z")
    refused(target, "schedule", "backfill", "beat", *window, message="past the dates Python can hold")


def test_app_and_dsn_mistakes_are_one_line_outside_a_command_run(tmp_path: Path) -> None:
    target = Target("sqlite", f"sqlite:///{tmp_path / 'bus.db'}", None)
    refused(target, "dashboard", "no.such.module:bus", message="cannot import 'no.such.module'")
    refused(target, "dashboard", "tests.apps.cli_app:nope", message="is not an eventbus.Bus")
    refused(target, "worker", ":bus", message="':bus' is not module:attribute")
    refused(target, "dashboard", ".relative:bus", message="'.relative:bus' is not module:attribute")
    refused(target, "--dsn", "postgresql://h:abc/db", "dashboard", message="invalid PostgreSQL DSN")
    refused(target, "--dsn", "sqlite:///other.db", "dashboard", APP, message="names another database")
    out_of_range = "postgresql://postgres@127.0.0.1:99999/test"
    refused(target, "--dsn", out_of_range, "status", message="is not from 1 to 65535")
    refused(target, "worker", APP, "--concurrency", "100000", message="concurrency must be at most 10,000")
    missing = f"sqlite:///{tmp_path / 'no-such-directory' / 'bus.db'}"
    refused(target, "--dsn", missing, "migrate", message="cannot open the SQLite database")
