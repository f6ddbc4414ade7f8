-- The version of its class an event was published at (class keyword
-- version=N); a worker runs an older one through the class's upcasters before
-- decoding it. Rows already in the log were published before versions
-- existed: they are version 1. A constant default adds the column without
-- rewriting the table.
ALTER TABLE {schema}.events ADD COLUMN version integer NOT NULL DEFAULT 1;

-- The versions of each type in the log, for `eventbus status`: a skip scan
-- over this index finds them with one probe per (type, version). Partial, so
-- an event at version 1 (every type that never declared a version) costs no
-- index insert on publish; version 1 rows are counted through the
-- (event_type, key) index instead.
CREATE INDEX events_versions ON {schema}.events (event_type, version) WHERE version <> 1;
