"""The example application's order flow for the dashboard's screenshots (no state machine).

``eventbus dashboard tests.apps.web_example:bus``; the database comes from ``EVENTBUS_DSN``.
"""

from __future__ import annotations

from eventbus import Bus
from handlers import orders, payments, shipping


def build(dsn: str | None = None, schema: str | None = None) -> Bus:
    bus = Bus(dsn, schema=schema)
    for router in (orders.router, payments.router, shipping.router):
        bus.include(router)
    return bus


bus = build()
