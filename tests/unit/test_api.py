"""Pure parts: retry policy, registration checks, names, public surface."""

from __future__ import annotations

import pytest

import eventbus
from eventbus import (
    Bus,
    ConfigurationError,
    Context,
    DuplicateSubscription,
    Event,
    HandlerSignatureError,
    RetryPolicy,
)
from eventbus.backends._migrations import Migration, discover, pending
from eventbus.backends._sql import validate_schema
from eventbus.event import decode_event, encode_event

from ..helpers import OrderPlaced, PaymentRequested


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


@pytest.mark.parametrize("name", ["Eventbus", "1abc", "a-b", 'x"; drop', "a" * 64, ""])
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
    with pytest.raises(eventbus.MigrationChecksumMismatch):
        pending([edited], {1: first.checksum})
