-- `eventbus trace` reads a chain by its root: every event whose correlation_id
-- is the root. Partial, so only follow-ups (events emitted by a handler) pay
-- for the index entry; an event published directly has no correlation_id.
CREATE INDEX events_correlation ON {schema}.events (correlation_id)
    WHERE correlation_id IS NOT NULL;

-- The last run of each maintenance task (the pruner), for `eventbus status`.
CREATE TABLE {schema}.maintenance (
    name        text        PRIMARY KEY,
    ran_at      timestamptz NOT NULL DEFAULT now(),
    report      jsonb       NOT NULL DEFAULT '{}'
);
