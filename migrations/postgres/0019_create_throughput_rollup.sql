-- The throughput rollup the dashboard's charts read, so that they never scan
-- the deliveries. Rows are only inserted, and deleted by retention (no UPDATE,
-- so no dead tuple per delivery or per minute):
--   - each worker adds one row per (subscription, minute) it ran handlers in,
--     with its completed, failed and dead counts and a histogram of handler
--     durations (fixed log-spaced buckets, merged by summing); readers sum the
--     rows of a minute;
--   - one row per (subscription, minute) samples the queue (pending is set):
--     the pending count and the age of the oldest due pending delivery,
--     written by whichever worker comes first in that minute.
CREATE TABLE {schema}.throughput_rollup (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    minute          timestamptz NOT NULL,          -- the start of the minute (UTC)
    subscription_id int         NOT NULL,
    completed       int         NOT NULL DEFAULT 0,
    failed          int         NOT NULL DEFAULT 0, -- failed attempts to be retried
    dead            int         NOT NULL DEFAULT 0, -- failed attempts that dead-lettered
    durations       jsonb,                          -- {"bucket": runs}: see eventbus.throughput
    pending         bigint,                         -- a queue sample: set on sample rows only
    lag_seconds     float8                          -- a queue sample: oldest due pending's age
);

-- The charts read a window of minutes; retention walks the oldest rows in
-- (minute, id) order: one range read of this index each.
CREATE INDEX throughput_rollup_minute ON {schema}.throughput_rollup (minute, id);
-- One queue sample per subscription and minute: a second worker's is refused.
CREATE UNIQUE INDEX throughput_rollup_sample ON {schema}.throughput_rollup (minute, subscription_id)
    WHERE pending IS NOT NULL;
