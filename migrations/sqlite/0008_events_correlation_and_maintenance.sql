-- `eventbus trace` reads a chain by its root: every event whose correlation_id
-- is the root. Partial, so only follow-ups (events emitted by a handler) pay
-- for the index entry; an event published directly has no correlation_id.
CREATE INDEX events_correlation ON events (correlation_id)
    WHERE correlation_id IS NOT NULL;

-- The last run of each maintenance task (the pruner), for `eventbus status`.
CREATE TABLE maintenance (
    name        TEXT    PRIMARY KEY,
    ran_at      REAL    NOT NULL,
    report      TEXT    NOT NULL DEFAULT '{}'
);
