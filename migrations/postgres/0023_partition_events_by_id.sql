-- The event log becomes a table partitioned by id ranges ("chunks"), so that
-- retention gives space back by dropping a whole chunk (DROP TABLE: no dead
-- tuple, nothing for vacuum) instead of deleting events one row at a time.
--
-- - id stays the primary key (it is the partition key): a lookup by id, and
--   the claim's join on e.id = c.event_id, reads one chunk.
-- - A partitioned table has no identity column: ids come from the sequence
--   event_ids. Time decides when a chunk closes (see rotate_event_chunks): the
--   sequence then jumps to the start of the next chunk, so ids keep
--   increasing but are not contiguous across a chunk boundary.
-- - A chunk is wide (2^32 ids by default) and the next one always exists
--   ahead, so a publish always finds its partition. events_kept, the default
--   partition, holds the few events that outlive their dropped chunk (an
--   event with a retained dead letter or a pending delivery, a key inside
--   its dedup window) under their own ids, and any id no chunk covers.
-- - The dedup of keys moves to event_keys (a partitioned table cannot have a
--   unique index without the partition key): publish inserts the key there
--   with ON CONFLICT DO NOTHING, and the event only when its key was new.
--
-- The existing table, with its rows, becomes the first chunk: nothing is
-- copied, pending deliveries and dead letters keep their events.

-- The identity's position, before the identity goes.
CREATE SEQUENCE {schema}.event_ids AS bigint;
SELECT setval('{schema}.event_ids',
              greatest(coalesce((SELECT max(id) FROM {schema}.events), 0),
                       coalesce(pg_sequence_last_value(
                           pg_get_serial_sequence('{schema}.events', 'id')::regclass), 0)) + 1,
              false);

-- Dedup by (type, key): one row per key taken, written by publish in the
-- statement that inserts the event. event_id is the event that took it.
-- created_at is the event's: the dedup window counts from it.
CREATE TABLE {schema}.event_keys (
    event_type text        NOT NULL,
    key        text        NOT NULL,
    event_id   bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_type, key)
);
INSERT INTO {schema}.event_keys (event_type, key, event_id, created_at)
SELECT event_type, key, id, created_at FROM {schema}.events WHERE key IS NOT NULL;

ALTER TABLE {schema}.events RENAME TO events_0;
ALTER TABLE {schema}.events_0 ALTER COLUMN id DROP IDENTITY;
ALTER TABLE {schema}.events_0 DROP CONSTRAINT events_type_key;
ALTER INDEX {schema}.events_pkey RENAME TO events_0_pkey;
ALTER INDEX {schema}.events_correlation RENAME TO events_0_correlation;
ALTER INDEX {schema}.events_versions RENAME TO events_0_versions;

CREATE TABLE {schema}.events (
    id              bigint      NOT NULL DEFAULT nextval('{schema}.event_ids'),
    event_type      text        NOT NULL,
    key             text,
    payload         bytea       NOT NULL,      -- msgspec JSON, decoded by the worker
    headers         jsonb       NOT NULL DEFAULT '{}',
    correlation_id  bigint,                    -- root event of the chain
    causation_id    bigint,                    -- event whose handler emitted this one
    ordering_key    text,
    deliver_at      timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    version         integer     NOT NULL DEFAULT 1,
    priority        smallint    NOT NULL DEFAULT 0,
    PRIMARY KEY (id)
) PARTITION BY RANGE (id);
ALTER SEQUENCE {schema}.event_ids OWNED BY {schema}.events.id;

-- Not unique any more (event_keys is): it serves the backfill of a new
-- subscription (WHERE event_type = $1, a prefix) and the dashboard's lookup
-- of an event by key, as the unique index did.
CREATE INDEX events_type_key ON {schema}.events (event_type, key);
CREATE INDEX events_correlation ON {schema}.events (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX events_versions ON {schema}.events (event_type, version) WHERE version <> 1;

-- The chunks, oldest first: [lo, hi) of ids. opened_at: when the sequence
-- entered it (NULL for the chunk created ahead); closed_at: when it left it.
-- Every event of a chunk was created before its closed_at (created_at is its
-- transaction's start, before its id was drawn), so a chunk closed longer
-- ago than the retention holds only events past it.
CREATE TABLE {schema}.event_chunks (
    name       text        PRIMARY KEY,
    lo         bigint      NOT NULL UNIQUE,
    hi         bigint      NOT NULL CHECK (hi > lo),
    opened_at  timestamptz,
    closed_at  timestamptz
);

-- The old table is the first chunk, up to the next multiple of 2^32 after
-- the ids it holds; it is open (publishes go on into it) until the first
-- rotation, which comes at once when its oldest event is older than a chunk
-- may stay open.
DO $$
DECLARE
    hi bigint := ((SELECT last_value FROM {schema}.event_ids) / 4294967296 + 1) * 4294967296;
BEGIN
    EXECUTE format('ALTER TABLE {schema}.events ATTACH PARTITION {schema}.events_0 '
                   'FOR VALUES FROM (MINVALUE) TO (%s)', hi);
    EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.events FOR VALUES FROM (%s) TO (%s)',
                   'events_' || hi, hi, hi + 4294967296);
    INSERT INTO {schema}.event_chunks (name, lo, hi, opened_at)
    VALUES ('events_0', 0, hi, coalesce((SELECT min(created_at) FROM {schema}.events_0), now())),
           ('events_' || hi, hi, hi + 4294967296, NULL);
END $$;
CREATE TABLE {schema}.events_kept PARTITION OF {schema}.events DEFAULT;

-- One step of the chunk cycle, run by the pruner: close the open chunk when
-- it is older than max_age_seconds or fuller than fill (a fraction), moving
-- the sequence to the start of the chunk ahead, and create the next chunk
-- ahead (width ids), so that a publish never finds no partition. A sequence
-- that ran past the open chunk into the one ahead (a chunk filled between
-- two passes) opens that one. Returns the name of the chunk it closed, or
-- NULL. The caller holds the pruner's lock (one caller at a time) and a
-- short lock_timeout: creating a partition locks the parent briefly.
CREATE FUNCTION {schema}.rotate_event_chunks(width bigint, max_age_seconds float8, fill float8)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    last bigint := (SELECT last_value FROM {schema}.event_ids);
    cur {schema}.event_chunks;
    ahead {schema}.event_chunks;
    closed text;
BEGIN
    -- The chunk the sequence is in (an id past every chunk has none).
    SELECT * INTO cur FROM {schema}.event_chunks WHERE lo <= last AND last < hi;
    IF FOUND AND cur.opened_at IS NULL THEN
        UPDATE {schema}.event_chunks SET opened_at = now() WHERE name = cur.name;
        UPDATE {schema}.event_chunks SET closed_at = now() WHERE hi <= cur.lo AND closed_at IS NULL;
        cur.opened_at := now();
    END IF;
    SELECT * INTO ahead FROM {schema}.event_chunks ORDER BY lo DESC LIMIT 1;
    IF NOT FOUND OR ahead.lo <= last THEN  -- nothing ahead of the sequence: make a chunk there
        INSERT INTO {schema}.event_chunks (name, lo, hi)
        VALUES ('events_' || greatest(ahead.hi, last + 1), greatest(ahead.hi, last + 1),
                greatest(ahead.hi, last + 1) + width)
        RETURNING * INTO ahead;
        EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.events '
                       'FOR VALUES FROM (%s) TO (%s)', ahead.name, ahead.lo, ahead.hi);
    END IF;
    IF cur.name IS NULL
       OR (now() - cur.opened_at < max_age_seconds * interval '1 second'
           AND last - cur.lo + 1 < fill * (cur.hi - cur.lo)) THEN
        RETURN NULL;
    END IF;
    -- Close: the next id drawn is the first of the chunk ahead. nextval is
    -- not transactional: a publish that drew its id before this lands in the
    -- closing chunk, which stays until it is past retention.
    PERFORM setval('{schema}.event_ids', ahead.lo, false);
    UPDATE {schema}.event_chunks SET closed_at = now() WHERE name = cur.name;
    UPDATE {schema}.event_chunks SET opened_at = now() WHERE name = ahead.name;
    closed := cur.name;
    INSERT INTO {schema}.event_chunks (name, lo, hi)
    VALUES ('events_' || ahead.hi, ahead.hi, ahead.hi + width)
    RETURNING * INTO ahead;
    EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.events '
                   'FOR VALUES FROM (%s) TO (%s)', ahead.name, ahead.lo, ahead.hi);
    RETURN closed;
END $$;

-- Lock a closed chunk for its drop (ACCESS EXCLUSIVE, under the caller's
-- lock_timeout: a transaction that still writes or reads it holds it off,
-- and a publish that drew an id in it before it closed has committed when
-- the lock is granted). Returns the chunk's row, none if it is not closed.
CREATE FUNCTION {schema}.lock_event_chunk(chunk text)
RETURNS SETOF {schema}.event_chunks LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}.event_chunks WHERE name = chunk AND closed_at IS NOT NULL) THEN
        EXECUTE format('LOCK TABLE {schema}.%I IN ACCESS EXCLUSIVE MODE', chunk);
        RETURN QUERY SELECT * FROM {schema}.event_chunks WHERE name = chunk;
    END IF;
END $$;

-- Drop a closed chunk, locked by lock_event_chunk in this transaction (the
-- caller found it closed longer ago than the retention), keeping the events
-- survivors (a delivery of theirs left, a key inside its dedup window): they
-- move to events_kept under their own ids, their keys with them. The DROP
-- locks the parent (under the caller's lock_timeout) until the transaction
-- ends, so the events kept are inserted after it: the fewer, the shorter.
-- Returns the number of events kept.
CREATE FUNCTION {schema}.drop_event_chunk(chunk text, survivors bigint[])
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    c {schema}.event_chunks;
    kept {schema}.events[];
BEGIN
    SELECT * INTO STRICT c FROM {schema}.event_chunks WHERE name = chunk AND closed_at IS NOT NULL;
    kept := ARRAY(SELECT e FROM {schema}.events e
                  WHERE e.id >= c.lo AND e.id < c.hi AND e.id = ANY(survivors));
    EXECUTE format('DROP TABLE {schema}.%I', chunk);
    INSERT INTO {schema}.events SELECT (k).* FROM unnest(kept) AS k;
    DELETE FROM {schema}.event_chunks WHERE name = chunk;
    RETURN cardinality(kept);
END $$;
