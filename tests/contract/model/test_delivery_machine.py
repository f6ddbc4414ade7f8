"""The delivery contract against a model, in random interleavings of every step (Hypothesis).

``EVENTBUS_HYPOTHESIS_PROFILE`` picks how hard it looks: ``ci`` (the default,
a few seconds per backend) or ``long`` (thousands of longer runs, on demand;
see tests/contract/README.md).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

import asyncpg
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from eventbus import Bus, Context, RetryPolicy
from eventbus.backends.postgres import ring

from ...conftest import Target
from .machine import DeliveryMachine, Harness, Item
from .model import Sub

TABLES = ("delivery_attempts", "deliveries", "events", "kept_keys")
"""What an example leaves behind; deleting it is far cheaper than a new schema per example."""

PROFILES = {"ci": (40, 15, 120), "medium": (300, 40, 3600), "long": (2000, 80, 4 * 3600)}
"""Profile: (runs, steps per run at most, the test's timeout in seconds)."""
for _name, (_runs, _steps, _) in PROFILES.items():
    settings.register_profile(
        _name,
        max_examples=_runs,
        stateful_step_count=_steps,
        deadline=None,  # a step's time is the database's, and the machine is shared
        suppress_health_check=[HealthCheck.too_slow],
        # Shrinking a failure takes minutes of database steps: the default run prints
        # the failing steps as found (and saves them in .hypothesis/); a medium or long
        # run replays them first and shrinks them.
        phases=[p for p in Phase if p != Phase.shrink or _name != "ci"],
        print_blob=True,
    )
PROFILE = os.environ.get("EVENTBUS_HYPOTHESIS_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise pytest.UsageError(f"EVENTBUS_HYPOTHESIS_PROFILE={PROFILE!r}: use one of {', '.join(PROFILES)}")
BACKENDS = ["sqlite", "postgres", "postgres-append-only"] + (
    [] if PROFILE == "ci" else ["postgres-pgbouncer"]
)
"""PostgreSQL with the append-only hot path too; the longer runs go through PgBouncer in transaction mode."""


def _subscribe(bus: Bus) -> None:
    """Two subscriptions of one type that no worker serves: one plain, one FIFO per key."""

    async def ignore(event: Item, ctx: Context) -> None:
        raise AssertionError("no worker runs in the model test")

    bus.subscribe(Item, name="plain", retry=RetryPolicy(max_attempts=3))(ignore)
    bus.subscribe(Item, name="fifo", ordered=True, retry=RetryPolicy(max_attempts=2))(ignore)


async def _open(target: Target) -> tuple[Bus, tuple[Sub, ...]]:
    bus = target.bus()
    await bus.migrate()
    _subscribe(bus)
    ids = await bus.register()
    subs = (Sub("plain", ids["plain"], False, 3), Sub("fifo", ids["fifo"], True, 2))
    return bus, subs


def _sqlite_reset(target: Target) -> Callable[[], None]:
    path = target.dsn.removeprefix("sqlite:///")

    def reset() -> None:
        with sqlite3.connect(path, timeout=10) as conn:
            for table in TABLES:
                conn.execute(f"DELETE FROM {table}")  # fixed names

    return reset


def _postgres_reset(target: Target, conn: asyncpg.Connection, portal: BlockingPortal) -> Callable[[], None]:
    # On PostgreSQL the keys taken live beside the events (event_keys), and the append-only
    # path's deliveries in its ring and outcome log. DELETE, not TRUNCATE: an example leaves a
    # few rows, and TRUNCATE gives each of some forty partitions and their indexes new files.
    pg_only = ("event_keys", "ring_ready", "ring_claims", "delivery_log")
    statements = "; ".join(f"DELETE FROM {target.schema}.{t}" for t in (*TABLES, *pg_only))

    def reset() -> None:
        portal.call(conn.execute, statements)  # several statements: one implicit transaction

    return reset


@pytest.mark.parametrize("backend_kind", BACKENDS, indirect=True)
@pytest.mark.timeout(PROFILES[PROFILE][2])
def test_the_delivery_contract_holds_in_any_interleaving(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model takes any claimable deliveries a claim returns, and the steps Hypothesis draws
    # next follow from which; they must follow from the steps before, never from the clock.
    # On the append-only path a claim that found no more in deliveries skips looking there for
    # QUEUE_LOOK_SECONDS, so which deliveries the next claim took depended on how long the
    # steps between took, and Hypothesis refused a run that drew differently on the same steps.
    monkeypatch.setattr(ring, "QUEUE_LOOK_SECONDS", 0.0)
    with start_blocking_portal() as portal:
        bus, subs = portal.call(_open, target)
        conn = None if target.kind == "sqlite" else portal.call(asyncpg.connect, target.direct_dsn)
        try:
            reset = _sqlite_reset(target) if conn is None else _postgres_reset(target, conn, portal)
            harness = Harness(portal, bus, subs, reset, prunes_by_row=not target.options.get("append_only"))
            machine = type("DeliveryContract", (DeliveryMachine,), {"harness": harness})
            run_state_machine_as_test(machine, settings=settings.get_profile(PROFILE))
        finally:
            if conn is not None:
                portal.call(conn.close)
            portal.call(bus.aclose)
