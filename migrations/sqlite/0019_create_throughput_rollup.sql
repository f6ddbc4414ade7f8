-- The throughput rollup the dashboard's charts read, so that they never scan
-- the deliveries (the same table as the PostgreSQL migration of this name;
-- minute in epoch seconds). Rows are only inserted, and deleted by retention:
--   - each worker adds one row per (subscription, minute) it ran handlers in,
--     with its completed, failed and dead counts and a histogram of handler
--     durations (fixed log-spaced buckets, merged by summing); readers sum the
--     rows of a minute;
--   - one row per (subscription, minute) samples the queue (pending is set):
--     the pending count and the age of the oldest due pending delivery,
--     written by whichever worker comes first in that minute.
CREATE TABLE throughput_rollup (
    id              INTEGER PRIMARY KEY,
    minute          INTEGER NOT NULL,            -- the start of the minute (epoch seconds)
    subscription_id INTEGER NOT NULL,
    completed       INTEGER NOT NULL DEFAULT 0,
    failed          INTEGER NOT NULL DEFAULT 0,  -- failed attempts to be retried
    dead            INTEGER NOT NULL DEFAULT 0,  -- failed attempts that dead-lettered
    durations       TEXT,                        -- {"bucket": runs}: see eventbus.throughput
    pending         INTEGER,                     -- a queue sample: set on sample rows only
    lag_seconds     REAL                         -- a queue sample: oldest due pending's age
);

-- The charts read a window of minutes; retention walks the oldest rows in
-- (minute, id) order: one range read of this index each.
CREATE INDEX throughput_rollup_minute ON throughput_rollup (minute, id);
-- One queue sample per subscription and minute: a second worker's is refused.
CREATE UNIQUE INDEX throughput_rollup_sample ON throughput_rollup (minute, subscription_id)
    WHERE pending IS NOT NULL;
