"""The example application's bus: ``eventbus worker handlers.app:bus``.

The database comes from ``$EVENTBUS_DSN`` and defaults to ``./eventbus.db``.
"""

from __future__ import annotations

from eventbus import Bus

from . import gallery, orders, payments, retrain, shipping

bus = Bus()
bus.include(orders.router)
bus.include(payments.router)
bus.include(shipping.router)
bus.include(retrain.machine)
bus.include(gallery.thumbnail)
bus.include(gallery.album)
