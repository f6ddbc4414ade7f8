"""Versioned events through the command line: publish at a version, status and dead letters show it."""

from __future__ import annotations

import json

from ..conftest import Target
from .test_cli import eventbus

APP = "tests.apps.versions_app:bus"


def test_versions_through_publish_status_and_dead_letters(target: Target) -> None:
    eventbus(target, "migrate")
    eventbus(target, "worker", APP, "--burst")  # registers the subscription
    # Written in version 1 (checked through the upcaster), in the current version, and raw.
    heavy = '{"parcel_id": "heavy", "kilos": 9}'
    eventbus(target, "publish", "cli.parcel", heavy, "--event-version", "1", "--app", APP)
    eventbus(target, "publish", "cli.parcel", '{"parcel_id": "b", "grams": 1}', "--app", APP)
    eventbus(target, "publish", "cli.parcel", '{"parcel_id": "c", "kilos": 1}', "--event-version", "1")
    eventbus(target, "worker", APP, "--burst")

    status = json.loads(eventbus(target, "status", "--json").stdout)
    (parcels,) = [t for t in status["event_types"] if t["event_type"] == "cli.parcel"]
    assert parcels["versions"] == {"1": 2, "2": 1}
    assert {r["status"]: r["count"] for r in status["rows"]} == {"completed": 2, "dead": 1}
    line = next(x for x in eventbus(target, "status").stdout.splitlines() if x.startswith("cli.parcel"))
    assert line.endswith("v1 2, v2 1"), line

    (dead,) = json.loads(eventbus(target, "dlq", "list", "--json").stdout)
    assert dead["event_version"] == 1
    assert dead["last_error"] == "ValueError: heavy is too heavy: 9000 g"  # upcast before the handler
    assert "(cli.parcel v1)" in eventbus(target, "dlq", "show", str(dead["id"])).stdout


def test_a_payload_of_a_version_the_app_cannot_read_is_refused(target: Target) -> None:
    eventbus(target, "migrate")
    payload = '{"parcel_id": "x", "grams": 1}'
    future = eventbus(
        target, "publish", "cli.parcel", payload, "--event-version", "3", "--app", APP, check=False
    )
    assert future.returncode != 0 and "FutureEventVersion" in future.stderr
    assert "Traceback" not in future.stderr
    zero = eventbus(target, "publish", "cli.parcel", payload, "--event-version", "0", check=False)
    assert zero.returncode != 0 and "--event-version" in zero.stderr
