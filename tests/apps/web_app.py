"""The dashboard tests' application: ``eventbus dashboard tests.apps.web_app:bus``.

The same subscriptions, machine and schedule the tests seed (tests/features/web/_data.py);
the database comes from ``EVENTBUS_DSN`` / ``EVENTBUS_SCHEMA``.
"""

from __future__ import annotations

from eventbus import Bus
from tests.features.web._data import declare

bus = Bus()
declare(bus)
