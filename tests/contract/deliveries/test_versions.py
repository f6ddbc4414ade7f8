"""Versioned events: older versions reach handlers, dead letters and replays as the current class."""

from __future__ import annotations

import sqlite3
from typing import Any

import asyncpg

from eventbus import Context, DecodeError, Event, RetryPolicy
from eventbus.errors import FutureEventVersion, MissingUpcaster
from eventbus.types import DeliveryFilter

from ...conftest import Target
from ...support.helpers import OrderPlaced, counts, drain


class OrderV1(Event, event_type="test.versioned_order"):
    """The event as the code first declared it (version 1)."""

    order_id: str
    amount: int


class OrderV2(Event, event_type="test.versioned_order", version=2):
    order_id: str
    total_cents: int


class Order(Event, event_type="test.versioned_order", version=3):
    """The current class: two upcasters bring versions 1 and 2 to it."""

    order_id: str
    total_cents: int
    currency: str


@Order.upcast(1)
def _order_v1(payload: dict[str, Any]) -> dict[str, Any]:
    payload["total_cents"] = payload.pop("amount")
    return payload


@Order.upcast(2)
def _order_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "currency": "EUR"}


class Parcel(Event, event_type="test.versioned_parcel", version=3):
    """Only version 2 can be upcast: version 1 has no upcaster."""

    parcel_id: str
    grams: int


@Parcel.upcast(2)
def _parcel_v2(payload: dict[str, Any]) -> dict[str, Any]:
    payload["grams"] = payload.pop("kilos") * 1000
    return payload


class ParcelV1(Event, event_type="test.versioned_parcel"):
    parcel_id: str


class ParcelV4(Event, event_type="test.versioned_parcel", version=4):
    parcel_id: str
    grams: int
    fragile: bool


class Receipt(Event, event_type="test.versioned_receipt", version=2):
    order_id: str


async def _sql(target: Target, sql: str) -> None:
    """One statement on the test's own store, outside the bus (schema ``{s}`` on PostgreSQL)."""
    if target.kind == "sqlite":
        with sqlite3.connect(target.dsn.removeprefix("sqlite:///")) as db:
            db.execute(sql.replace("{s}.", ""))
        return
    conn = await asyncpg.connect(target.direct_dsn)
    try:
        await conn.execute(sql.replace("{s}", f'"{target.schema}"'))
    finally:
        await conn.close()


def _collect(bus, seen: list[Order], name: str = "orders", **options: Any) -> None:
    @bus.subscribe(Order, name=name, **options)
    async def handle(event: Order, ctx: Context) -> None:
        seen.append(event)


async def test_every_older_version_reaches_the_handler_as_the_current_class(bus) -> None:
    seen: list[Order] = []
    _collect(bus, seen)
    await bus.register()
    await bus.publish(OrderV1(order_id="a", amount=5))
    await bus.publish(OrderV2(order_id="b", total_cents=6))
    await bus.publish(Order(order_id="c", total_cents=7, currency="USD"))
    await drain(bus)
    assert sorted(seen, key=lambda o: o.order_id) == [
        Order(order_id="a", total_cents=5, currency="EUR"),
        Order(order_id="b", total_cents=6, currency="EUR"),
        Order(order_id="c", total_cents=7, currency="USD"),
    ]
    assert [(await bus.event(i)).event_version for i in (1, 2, 3)] == [1, 2, 3]


async def test_rows_written_before_versions_existed_are_version_1(bus, target: Target) -> None:
    """A row inserted without the version column (an older publisher) reads as version 1, and a
    subscription added later backfills it through the upcasters."""
    first = await bus.publish(OrderV1(order_id="seed", amount=1))
    blob = "BLOB" if target.kind == "sqlite" else "bytea"
    payload = '{"order_id": "old", "amount": 9}'
    await _sql(
        target,
        "INSERT INTO {s}.events (event_type, key, payload, headers, created_at, deliver_at) "
        f"SELECT event_type, 'old', CAST('{payload}' AS {blob}), headers, created_at, deliver_at "
        "FROM {s}.events WHERE id = 1",
    )
    assert first.event_id == 1
    assert (await bus.event(2)).event_version == 1
    seen: list[Order] = []
    _collect(bus, seen, name="late")
    await bus.register()  # a new subscription backfills the log
    await drain(bus)
    assert sorted(o.order_id for o in seen) == ["old", "seed"]
    assert {o.total_cents for o in seen} == {1, 9}


async def test_a_version_with_no_upcaster_goes_dead_with_a_typed_error(bus) -> None:
    seen: list[Parcel] = []

    @bus.subscribe(Parcel, name="parcels", retry=RetryPolicy(max_attempts=5))
    async def handle(event: Parcel, ctx: Context) -> None:
        seen.append(event)

    await bus.register()
    await bus.publish(ParcelV1(parcel_id="p1"))
    await bus.publish_raw("test.versioned_parcel", b'{"parcel_id":"p2","kilos":2}', event_version=2)
    await bus.publish(ParcelV4(parcel_id="p4", grams=1, fragile=True))
    await drain(bus)
    assert seen == [Parcel(parcel_id="p2", grams=2000)]
    dead = await bus.dead_letters(subscription="parcels")
    assert [(d.event_id, d.event_version, d.attempts) for d in dead] == [(1, 1, 1), (3, 4, 1)]
    assert dead[0].last_error is not None and dead[0].last_error.startswith(
        "MissingUpcaster: test.versioned_parcel version 1 cannot be read as version 3"
    )
    assert dead[1].last_error is not None and dead[1].last_error.startswith(
        "FutureEventVersion: test.versioned_parcel version 4 is newer than Parcel"
    )
    detail = await bus.delivery(dead[0].id)
    assert [a.error_type for a in detail.history] == ["MissingUpcaster"]
    c = await counts(bus)
    assert c[("parcels", "completed")] == 1 and c[("parcels", "dead")] == 2


async def test_dead_letters_decode_through_the_upcasters(bus) -> None:
    @bus.subscribe(Order, name="orders", retry=RetryPolicy(max_attempts=1))
    async def handle(event: Order, ctx: Context) -> None:
        raise RuntimeError(f"gateway down for {event.order_id}")

    await bus.register()
    await bus.publish(OrderV1(order_id="a", amount=5))
    await bus.publish(OrderV2(order_id="b", total_cents=6))
    await drain(bus)
    dead = await bus.dead_letters(subscription="orders")
    assert [d.event_version for d in dead] == [1, 2]
    details = [await bus.delivery(d.id) for d in dead]
    assert details[0].payload == b'{"order_id":"a","amount":5}'  # stored as published
    assert [bus.decode(d) for d in details] == [
        Order(order_id="a", total_cents=5, currency="EUR"),
        Order(order_id="b", total_cents=6, currency="EUR"),
    ]
    view = await bus.event(dead[0].event_id)
    assert view.event_version == 1 and view.deliveries[0].event_version == 1
    assert bus.decode(view) == Order(order_id="a", total_cents=5, currency="EUR")
    assert details[0].history[0].error_type == "RuntimeError"  # the handler ran on the upcast event


async def test_decoding_a_dead_letter_without_its_upcaster_is_a_typed_error(bus) -> None:
    @bus.subscribe(Parcel, name="parcels")
    async def handle(event: Parcel, ctx: Context) -> None: ...

    await bus.register()
    await bus.publish(ParcelV1(parcel_id="p1"))
    await bus.publish(ParcelV4(parcel_id="p4", grams=1, fragile=False))
    await drain(bus)
    dead = [await bus.delivery(d.id) for d in await bus.dead_letters()]
    for detail, error in zip(dead, (MissingUpcaster, FutureEventVersion), strict=True):
        try:
            bus.decode(detail)
        except DecodeError as exc:
            assert type(exc) is error
        else:
            raise AssertionError(f"{detail.event_version} decoded")


async def test_replay_decodes_through_an_upcaster_added_after_the_dead_letter(bus) -> None:
    class Shipment(Event, event_type="test.versioned_shipment", version=2):
        shipment_id: str
        carrier: str

    class ShipmentV1(Event, event_type="test.versioned_shipment"):
        shipment_id: str

    seen: list[Any] = []

    @bus.subscribe(Shipment, name="shipments")
    async def handle(event, ctx):  # a class local to the test: left unannotated
        seen.append(event)

    await bus.register()
    await bus.publish(ShipmentV1(shipment_id="s1"))
    await drain(bus)
    assert seen == [] and len(await bus.dead_letters()) == 1

    @Shipment.upcast(1)  # the fix is deployed
    def _(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "carrier": "post"}

    assert await bus.replay(DeliveryFilter(status="dead", subscription="shipments")) == 1
    await drain(bus)
    assert seen == [Shipment(shipment_id="s1", carrier="post")]
    assert await bus.dead_letters() == []


async def test_follow_ups_are_stored_at_their_class_version(bus) -> None:
    @bus.subscribe(OrderPlaced, name="placed")
    async def placed(event: OrderPlaced, ctx: Context) -> None:
        ctx.emit(Receipt(order_id=event.order_id), key=f"r:{event.order_id}")

    await bus.register()
    await bus.publish(OrderPlaced(order_id="o-1"))
    await drain(bus)
    await bus.publish_many([Receipt(order_id="o-2")])
    assert [(await bus.event(i)).event_version for i in (1, 2, 3)] == [1, 2, 2]
    assert (await bus.event(2)).event_type == "test.versioned_receipt"


async def test_status_shows_the_versions_in_the_log(bus) -> None:
    await bus.publish_many([OrderV1(order_id=f"a{i}", amount=i) for i in range(3)])
    await bus.publish(OrderV2(order_id="b", total_cents=1))
    await bus.publish_many([Order(order_id=f"c{i}", total_cents=i, currency="EUR") for i in range(2)])
    await bus.publish_many([OrderPlaced(order_id="x"), OrderPlaced(order_id="y")])
    await bus.publish(Receipt(order_id="r"))
    report = await bus.status()
    versions = {t.event_type: t.versions for t in report.event_types}
    assert versions == {
        "test.order_placed": {1: 2},
        "test.versioned_order": {1: 3, 2: 1, 3: 2},
        "test.versioned_receipt": {2: 1},
    }


class Coupon(Event, event_type="test.versioned_coupon", version=2):
    code: str
    percent: int


@Coupon.upcast(1)
def _coupon_v1(payload: dict[str, Any]) -> dict[str, Any]:
    payload["percent"] = payload.pop("rate") * 100  # a version 1 payload without "rate" breaks it
    return payload


class CouponV1(Event, event_type="test.versioned_coupon"):
    code: str


async def test_an_upcaster_that_raises_sends_its_event_dead_and_the_worker_goes_on(bus) -> None:
    seen: list[Coupon] = []

    @bus.subscribe(Coupon, name="coupons", retry=RetryPolicy(max_attempts=5))
    async def handle(event: Coupon, ctx: Context) -> None:
        seen.append(event)

    await bus.register()
    await bus.publish(CouponV1(code="broken"))
    await bus.publish_raw("test.versioned_coupon", b'{"code":"ok","rate":1}', event_version=1)
    await bus.publish(Coupon(code="new", percent=5))
    await drain(bus)
    assert sorted(c.code for c in seen) == ["new", "ok"]
    (dead,) = await bus.dead_letters()
    assert dead.attempts == 1 and dead.event_version == 1  # not retried: it would fail the same way
    assert dead.last_error == (
        "DecodeError: upcaster of test.versioned_coupon from version 1 failed: KeyError: 'rate'"
    )
