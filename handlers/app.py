"""The example application's bus: ``eventbus worker handlers.app:bus``.

The database comes from ``$EVENTBUS_DSN`` and defaults to ``./eventbus.db``.
"""

from __future__ import annotations

from datetime import timedelta

from eventbus import Bus

from . import gallery, invoices, orders, payments, retrain, shipping

bus = Bus()
bus.include(orders.router)
bus.include(payments.router)
bus.include(shipping.router)
bus.include(retrain.machine)
bus.include(gallery.thumbnail)
bus.include(gallery.album)
invoices.declare(bus)  # claimed by a batch job or a script, not by workers
bus.schedule(  # every night, one retraining run per customer, each at its own time in 02:00-06:00
    "retrain-all",
    start=retrain.machine,
    checkpoint=retrain.checkpoint,
    cron="0 2 * * *",
    for_each=retrain.active_customers,
    spread=timedelta(hours=4),
)
