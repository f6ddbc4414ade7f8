"""Put this process's wall clock ``EVENTBUS_TEST_CLOCK_SKEW`` seconds off (tests only).

On PYTHONPATH, Python imports it at start-up, before any other module, so
``time.time`` and ``time.time_ns`` read a clock that is wrong, as on a host
whose clock drifted. (The library reads no other wall clock: ``datetime.now``
appears nowhere in it outside the CLI's ``--since``.) The monotonic clock is
left alone: it has no epoch to be wrong about.
"""

from __future__ import annotations

import os
import time

_SKEW = float(os.environ.get("EVENTBUS_TEST_CLOCK_SKEW", "0"))

if _SKEW:
    _real_time, _real_time_ns = time.time, time.time_ns
    time.time = lambda: _real_time() + _SKEW
    time.time_ns = lambda: _real_time_ns() + int(_SKEW * 1e9)
