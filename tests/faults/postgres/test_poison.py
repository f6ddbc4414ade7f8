"""Poison deliveries go dead in one attempt; healthy events keep flowing."""

from __future__ import annotations

from eventbus import Envelope

from ...apps.fault_events import Order
from ._support import settled, wait_until, worker_id_of

MAX_PAYLOAD = 4096
POISON = {
    "invalid-json": ("fault.order", b'{"n": 1,'),
    "not-utf8": ("fault.order", b"\xff\xfe\x00"),
    "not-an-object": ("fault.order", b"[1, 2, 3]"),
    "wrong-schema": ("fault.order", b'{"n": "one"}'),
    "missing-field": ("fault.order", b'{"pad": "x"}'),
    "unknown-type": ("fault.unknown", b'{"n": 1}'),
    "oversize": ("fault.order", b'{"n": 1, "pad": "' + b"x" * (MAX_PAYLOAD + 100) + b'"}'),
}


async def test_poison_dead_in_one_attempt(fault_target, procs, db) -> None:
    s = fault_target.schema
    w = procs.worker(
        "--poll-interval",
        "1",
        env={"FAULT_MAX_PAYLOAD": str(MAX_PAYLOAD), "FAULT_LEASE": "10"},
        name="poison",
    )
    await worker_id_of(db, s, w.pid)
    order_sub = await db.fetchval(f"SELECT id FROM \"{s}\".subscriptions WHERE name = 'order'")
    bus = fault_target.bus()
    async with bus:
        await bus.publish_many([Envelope(Order(n=i), key=f"h{i}") for i in range(25)])
        poison_ids = {}
        for name, (event_type, payload) in POISON.items():
            event_id = await db.fetchval(
                f'INSERT INTO "{s}".events (event_type, key, payload) VALUES ($1, $2, $3) RETURNING id',
                event_type,
                f"poison-{name}",
                payload,
            )
            poison_ids[name] = await db.fetchval(
                f'INSERT INTO "{s}".deliveries (event_id, subscription_id) VALUES ($1, $2) RETURNING id',
                event_id,
                order_sub,
            )
        await db.execute("SELECT pg_notify($1, 'fault.order')", f"eventbus_{s}")
        await bus.publish_many([Envelope(Order(n=i), key=f"h{i}") for i in range(25, 50)])
    await wait_until(lambda: settled(db, s), 20, interval=0.1, what="every delivery to end")

    for name, delivery_id in poison_ids.items():
        row = await db.fetchrow(f'SELECT * FROM "{s}".deliveries WHERE id = $1', delivery_id)
        assert row["status"] == "dead", (name, dict(row))
        assert row["attempts"] == 1, (name, row["attempts"])
        assert row["last_error"].startswith("DecodeError"), (name, row["last_error"])
        history = await db.fetch(
            f'SELECT error_type FROM "{s}".delivery_attempts WHERE delivery_id = $1', delivery_id
        )
        assert [h["error_type"] for h in history] == ["DecodeError"], name
    assert (
        await db.fetchval(
            f'SELECT count(*) FROM "{s}".handler_runs WHERE delivery_id = ANY($1::bigint[])',
            list(poison_ids.values()),
        )
        == 0
    )
    # Healthy events: every order completed, one follow-up each, completed too.
    healthy = dict(
        await db.fetch(
            f'SELECT s.name, count(*) FROM "{s}".deliveries d JOIN "{s}".subscriptions s '
            "ON s.id = d.subscription_id WHERE d.status = 'completed' GROUP BY 1"
        )
    )
    assert healthy == {"order": 50, "followup": 50}
    assert w.alive(), w.output()
