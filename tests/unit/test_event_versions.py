"""Versioned events: declaring versions and upcasters, and decoding older payloads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from eventbus import Bus, ConfigurationError, Context, DecodeError, Event
from eventbus.errors import FutureEventVersion, InvalidUpcaster, MissingUpcaster
from eventbus.event import check_upcasters, decode_event, encode_event, event_version_of
from eventbus.router import Router
from eventbus.schedules import EventTarget


class Item(Event, event_type="test.unit_item", version=3):
    sku: str
    quantity: int
    unit: str


@Item.upcast(1)
def _item_v1(payload: dict[str, Any]) -> dict[str, Any]:
    payload["quantity"] = payload.pop("qty")
    return payload


@Item.upcast(2)
def _item_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "unit": "each"}


def test_an_event_is_version_1_unless_it_declares_one() -> None:
    class Plain(Event, event_type="test.unit_plain"):
        x: int

    assert event_version_of(Plain) == 1
    assert event_version_of(Item) == 3
    assert Plain.__upcasters__ == {}


def test_older_payloads_run_through_the_chain_of_upcasters() -> None:
    assert decode_event(Item, b'{"sku":"a","qty":2}', 1) == Item(sku="a", quantity=2, unit="each")
    assert decode_event(Item, b'{"sku":"a","quantity":2}', 2) == Item(sku="a", quantity=2, unit="each")
    current = Item(sku="b", quantity=1, unit="kg")
    assert decode_event(Item, encode_event(current), 3) == current
    assert decode_event(Item, encode_event(current)) == current  # no version: the class's own


def test_a_version_with_no_upcaster_or_from_the_future_is_a_typed_decode_error() -> None:
    class Late(Event, event_type="test.unit_late", version=3):
        x: int

    @Late.upcast(2)
    def _(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    with pytest.raises(MissingUpcaster, match="no upcaster from version 1"):
        decode_event(Late, b'{"x":1}', 1)
    with pytest.raises(FutureEventVersion, match=r"version 4 is newer than .*Late \(version 3\)"):
        decode_event(Late, b'{"x":1}', 4)
    assert issubclass(MissingUpcaster, DecodeError) and issubclass(FutureEventVersion, DecodeError)


def test_an_upcaster_that_fails_or_returns_no_dict_is_a_decode_error() -> None:
    class Broken(Event, event_type="test.unit_broken", version=2):
        x: int

    @Broken.upcast(1)
    def _(payload: dict[str, Any]) -> dict[str, Any]:
        return payload["missing"]

    with pytest.raises(DecodeError, match=r"upcaster of test\.unit_broken from version 1 failed: KeyError"):
        decode_event(Broken, b'{"x":1}', 1)
    with pytest.raises(DecodeError, match="not a JSON object"):
        decode_event(Broken, b"[1]", 1)
    with pytest.raises(DecodeError, match="not JSON"):
        decode_event(Broken, b"{", 1)


def test_upcasting_to_a_payload_the_class_refuses_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match=r"does not decode as test\.unit_item"):
        decode_event(Item, b'{"sku":"a","qty":"two"}', 1)


def test_an_upcaster_from_the_class_version_or_above_is_refused_when_declared() -> None:
    with pytest.raises(InvalidUpcaster, match="at version 3: an upcaster from version 3"):
        Item.upcast(3)
    with pytest.raises(InvalidUpcaster, match="from version 5"):
        Item.upcast(5)
    with pytest.raises(InvalidUpcaster, match="at least 1"):
        Item.upcast(0)
    with pytest.raises(InvalidUpcaster, match="already has an upcaster from version 1"):
        Item.upcast(1)


def test_a_version_must_be_a_positive_int() -> None:
    for bad in (0, -1, True, "2"):
        with pytest.raises(ConfigurationError, match="version is an int of at least 1"):

            class Bad(Event, event_type="test.unit_bad", version=bad):
                x: int


class Gappy(Event, event_type="test.unit_gappy", version=4):
    x: int


class Later(Event, event_type="test.unit_later", version=3):
    x: int


def test_a_gap_in_the_chain_is_refused_at_subscribe_time() -> None:
    @Gappy.upcast(1)
    def _(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    with pytest.raises(InvalidUpcaster, match=r"none from \[2, 3\]"):
        check_upcasters(Gappy)

    router = Router()
    with pytest.raises(InvalidUpcaster, match="chain to the current version is broken"):

        @router.subscribe(Gappy, name="gappy")
        async def handle(event: Gappy, ctx: Context) -> None: ...

    assert router.subscriptions == {}


def test_a_gap_left_after_subscribing_is_refused_when_the_bus_registers() -> None:
    bus = Bus("sqlite:///unused-never-opened.db")

    @bus.subscribe(Later, name="later")
    async def handle(event: Later, ctx: Context) -> None: ...

    @Later.upcast(1)
    def _(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    with pytest.raises(InvalidUpcaster, match=r"none from \[2\]"):
        bus.specs()


def test_a_subclass_keeps_its_parents_upcasters_below_its_own_version() -> None:
    class Child(Item):
        pass

    assert set(Child.__upcasters__) == {1, 2}
    assert decode_event(Child, b'{"sku":"a","qty":2}', 1) == Child(sku="a", quantity=2, unit="each")


def test_events_carry_their_class_version_wherever_they_are_published() -> None:
    bus = Bus("sqlite:///unused-never-opened.db")
    assert bus.outgoing(Item(sku="a", quantity=1, unit="kg")).event_version == 3

    class Tick(Event, event_type="test.unit_tick", version=2):
        scheduled_for: datetime | None = None

    out = EventTarget(Tick).work("nightly", datetime(2026, 1, 1, tzinfo=UTC), 0.0)
    assert out.event_version == 2
    assert msgspec.json.decode(out.payload)["scheduled_for"].startswith("2026-01-01")
