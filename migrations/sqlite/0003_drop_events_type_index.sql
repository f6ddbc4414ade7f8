-- The unique index on (event_type, key) serves the backfill's lookup by event
-- type as a prefix; the separate (event_type, id) index only cost every publish
-- one more index insert (the same change as the PostgreSQL migration of this name).
DROP INDEX events_type_id;
