"""Pull claims from the command line: a script claims, exits, and settles later by id and token."""

from __future__ import annotations

import json

from ..apps.pull_app import Job, declare
from ..conftest import BusFactory, Target
from .test_cli import eventbus
from .test_cli_mistakes import refused

APP = ("--app", "tests.apps.pull_app:bus")


async def test_claim_then_settle_each_delivery_in_a_later_process(
    make_bus: BusFactory, target: Target
) -> None:
    bus = await make_bus()
    declare(bus)
    await bus.register()
    events = [(await bus.publish(Job(n=n))).event_id for n in range(3)]

    claimed = json.loads(
        eventbus(target, "claim", "pull.jobs", "--limit", "3", "--lease-seconds", "60", *APP).stdout
    )
    assert claimed["subscription"] == "pull.jobs" and claimed["lease_seconds"] == 60
    first, second, third = claimed["deliveries"]
    assert [d["event_id"] for d in (first, second, third)] == events
    assert first["payload"] == {"n": 0} and first["event_type"] == "pull.job" and first["attempt"] == 1
    assert first["lease_token"] == second["lease_token"] and first["created_at"]
    statuses = {r.event_id: r.status for r in await bus.find_deliveries()}
    assert [statuses[e] for e in events] == ["processing"] * 3  # the claim outlived its process

    done = '{"event_type": "pull.done", "payload": {"n": 0}}'
    token = first["lease_token"]
    completed = json.loads(
        eventbus(target, "complete", str(first["id"]), "--token", token, "--follow-up", done, *APP).stdout
    )
    assert completed["status"] == "completed"
    retried = eventbus(
        target, "fail", str(second["id"]), "--token", token, "--error", "GPU busy", "--retry-in", "30", *APP
    )
    assert json.loads(retried.stdout)["status"] == "pending"
    refused(
        target, "complete", str(first["id"]), "--token", token, *APP, message="is not held under lease token"
    )
    extended = eventbus(target, "extend", str(third["id"]), "--token", token, "--lease-seconds", "600", *APP)
    assert json.loads(extended.stdout)["status"] == "processing"
    released = json.loads(eventbus(target, "release", str(third["id"]), "--token", token, *APP).stdout)
    assert released["status"] == "pending" and released["attempts"] == 0  # the attempt not counted

    (follow_up,) = [r for r in await bus.find_deliveries() if r.subscription == "pull.done"]
    assert (await bus.delivery(follow_up.id)).causation_id == events[0]
    detail = await bus.delivery(second["id"])
    assert [(a.error_type, a.message) for a in detail.history] == [("Retry", "GPU busy")]
    assert (detail.run_at - detail.updated_at).total_seconds() > 25  # retried in 30 s, not by the policy


async def test_pull_command_mistakes_are_one_line(make_bus: BusFactory, target: Target) -> None:
    bus = await make_bus()
    declare(bus)
    await bus.register()
    await bus.publish(Job(n=1))
    batch = await bus.pull.take("pull.jobs")
    delivery, token = str(batch[0].id), batch[0].lease_token
    refused(target, "claim", "pull.jbos", *APP, message="no subscription named 'pull.jbos'")
    refused(target, "extend", delivery, "--token", "t-1", *APP, message="'t-1' is not a lease token")
    bad = ("--follow-up", '{"event_type": "pull.done", "payload": {"n": "one"}}')
    refused(target, "complete", delivery, "--token", token, *bad, *APP, message="DecodeError")
    assert (await bus.delivery(batch[0].id)).status == "processing"  # nothing settled by a mistake
