-- Backfilling a new subscription reads the log by event type. The unique
-- constraint's index on (event_type, key) already serves `WHERE event_type = $1`
-- as a prefix, so the separate (event_type, id) index only cost every publish
-- one more index insert (about 15% of a single publish).
DROP INDEX {schema}.events_type_id;
