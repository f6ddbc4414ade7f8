"""Pure parts: retry policy, registration checks, names, public surface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import eventbus
from eventbus import Bus, ConfigurationError, Context, Event, RetryPolicy, Worker
from eventbus.backends._migrations import Migration, discover, pending
from eventbus.backends._sql import validate_schema
from eventbus.backends.postgres import PostgresBackend
from eventbus.errors import DuplicateSubscription, HandlerSignatureError
from eventbus.event import decode_event, encode_event

from ..support.helpers import OrderPlaced, PaymentRequested


def test_backoff_grows_is_capped_and_jittered() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay_seconds=1, max_delay_seconds=30, jitter=0.2)
    assert policy.bounds(1) == (0.8, 1.2)
    assert policy.bounds(3) == (3.2, 4.8)
    assert policy.bounds(9) == (24.0, 30.0)
    assert all(3.2 <= policy.delay_for(3) <= 4.8 for _ in range(100))
    assert policy.exhausted(10) and not policy.exhausted(9)
    with pytest.raises(ConfigurationError):
        RetryPolicy(max_attempts=0)


def test_registration_refuses_duplicates_and_wrong_signatures(tmp_path) -> None:
    bus = Bus(f"sqlite:///{tmp_path / 'x.db'}")

    @bus.subscribe(OrderPlaced, name="one")
    async def one(event: OrderPlaced, ctx: Context) -> None: ...

    with pytest.raises(DuplicateSubscription):
        bus.subscribe(OrderPlaced, name="one")(one)
    with pytest.raises(HandlerSignatureError, match="annotated for"):

        @bus.subscribe(OrderPlaced, name="two")
        async def two(event: PaymentRequested, ctx: Context) -> None: ...

    with pytest.raises(HandlerSignatureError, match="async def"):

        @bus.subscribe(OrderPlaced, name="three")  # type: ignore[type-var]
        def three(event: OrderPlaced, ctx: Context) -> None: ...

    with pytest.raises(HandlerSignatureError, match="exactly"):

        @bus.subscribe(OrderPlaced, name="four")  # type: ignore[type-var]
        async def four(event: OrderPlaced) -> None: ...

    assert list(bus.subscriptions) == ["one"]


def test_event_types_are_validated_and_round_trip() -> None:
    with pytest.raises(ConfigurationError):

        class Bad(Event, event_type="has space"):
            x: int

    class NoType(Event):
        x: int

    bus = Bus("sqlite:///unused.db")
    with pytest.raises(ConfigurationError, match="no event_type"):
        bus.subscribe(NoType)
    event = OrderPlaced(order_id="o", amount_cents=3)
    assert decode_event(OrderPlaced, encode_event(event)) == event


@pytest.mark.parametrize("name", ["Eventbus", "1abc", "a-b", 'x"; drop', "a" * 64, "", "pg_events"])
def test_schema_names_must_be_plain_identifiers(name: str) -> None:
    with pytest.raises(ConfigurationError):
        validate_schema(name)


def test_migration_files_are_named_and_refused_when_edited() -> None:
    for backend in ("postgres", "sqlite"):
        found = discover(backend)
        assert [m.version for m in found] == list(range(1, len(found) + 1))
        assert {m.name.split("_", 1)[1] for m in found} == {
            m.name.split("_", 1)[1] for m in discover("postgres")
        }
    first = discover("postgres")[0]
    assert pending([first], {1: first.checksum}) == []
    edited = Migration(1, first.name, first.sql + "\n-- edited")
    with pytest.raises(eventbus.errors.MigrationChecksumMismatch):
        pending([edited], {1: first.checksum})


@pytest.mark.parametrize("schema", ["a" * 54, "a" * 55, "a" * 63, "b" + "a" * 62])
def test_every_valid_schema_has_its_own_notify_channel(schema: str) -> None:
    backend = PostgresBackend("postgresql://u@h/db", schema)
    assert len(backend.db.channel.encode()) <= 63
    assert backend.db.channel != PostgresBackend("postgresql://u@h/db", schema[:-1] + "z").db.channel


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://h:abc/db",
        "postgresql://[::1/db",
        "postgresql://a:1,b:x/db",
        "postgresql://h:99999/db",
        "postgresql://a:5432,b:0/db",
    ],
)
def test_malformed_dsns_are_refused_at_construction(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid PostgreSQL DSN"):
        Bus(dsn)


def test_multi_host_and_ipv6_dsns_are_accepted() -> None:
    for dsn in ("postgresql://u@a:5432,b:5433/db", "postgresql://u@[::1]:5432/db", "postgresql://u@[::1]/db"):
        assert Bus(dsn).backend.kind == "postgres"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"recovery_interval_seconds": 0}, "recovery_interval_seconds must be"),
        ({"recovery_interval_seconds": -1}, "recovery_interval_seconds must be"),
        ({"poll_interval_seconds": 0}, "poll_interval_seconds must be"),
        ({"poll_interval_seconds": float("inf")}, "poll_interval_seconds must be"),
        ({"grace_seconds": -1}, "grace_seconds must be"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"concurrency": 10**20}, "concurrency must be at most 10,000"),
        ({"batch_size": -5}, "batch_size must be at least 1"),
        ({"subscriptions": ["charge", "chrage"]}, "no subscription named chrage"),
    ],
)
def test_worker_refuses_settings_that_cannot_work(options: dict[str, Any], message: str) -> None:
    bus = Bus("sqlite:///unused.db")

    @bus.subscribe(OrderPlaced, name="charge")
    async def charge(event: OrderPlaced, ctx: Context) -> None:
        pass

    with pytest.raises(ConfigurationError, match=message):
        Worker(bus, **options)
    Worker(bus, grace_seconds=0, subscriptions=["charge"])  # zero grace is a valid choice


@pytest.mark.parametrize("delay", [float("inf"), float("nan"), 1e300, -1])
async def test_publish_refuses_delays_that_never_run(delay: float, tmp_path: Path) -> None:
    bus = Bus(f"sqlite:///{tmp_path / 'bus.db'}", migrate=True)
    try:
        with pytest.raises(ConfigurationError, match="delay"):
            await bus.publish(OrderPlaced(order_id="o"), delay=delay)
        with pytest.raises(ConfigurationError, match="delay"):
            await bus.publish_raw("test.order_placed", b"{}", delay=delay)
        with pytest.raises(ConfigurationError, match="invalid event_type"):
            await bus.publish_raw("has space", b"{}")
        assert (await bus.status()).events == 0
    finally:
        await bus.aclose()
