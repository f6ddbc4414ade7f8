"""Worker application for the schedule tests (tests/features/schedules).

Run as ``eventbus worker tests.apps.schedule_app:bus``; the bus comes from
``EVENTBUS_DSN`` / ``EVENTBUS_SCHEMA``. Schedules are steered by env vars:

``SCHEDULE_COUNT``   how many every-second schedules ``sec-0`` … (default 1)
``SCHEDULE_MISSED``  their missed-run policy (default "all")
``SCHEDULE_HOURLY``  "1": also ``hourly``, every hour anchored at ``SCHEDULE_ANCHOR`` (epoch seconds)

The events have no subscription: a fired occurrence is its event in the log.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from eventbus import Bus

from .schedule_events import Beat

bus = Bus()

for _n in range(int(os.environ.get("SCHEDULE_COUNT", "1"))):
    bus.schedule(
        f"sec-{_n}",
        Beat,
        every=timedelta(seconds=1),
        missed=os.environ.get("SCHEDULE_MISSED", "all"),  # type: ignore[arg-type]
        overlap="allow",
        max_catchup=1000,
    )

if os.environ.get("SCHEDULE_HOURLY") == "1":
    bus.schedule(
        "hourly",
        Beat,
        every=timedelta(hours=1),
        anchor=datetime.fromtimestamp(float(os.environ["SCHEDULE_ANCHOR"]), UTC),
        overlap="allow",
    )
