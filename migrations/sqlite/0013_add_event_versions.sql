-- The version of its class an event was published at (class keyword
-- version=N); a worker runs an older one through the class's upcasters before
-- decoding it. Rows already in the log are version 1 (the same change as the
-- PostgreSQL migration of this name).
ALTER TABLE events ADD COLUMN version INTEGER NOT NULL DEFAULT 1;

-- The versions of each type in the log, for `eventbus status`. Partial, so an
-- event at version 1 (every type that never declared a version) costs no
-- index insert on publish.
CREATE INDEX events_versions ON events (event_type, version) WHERE version <> 1;
