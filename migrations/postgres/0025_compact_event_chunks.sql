-- A closed chunk of the event log that many events must outlive (more than a
-- drop re-inserts while it holds the log) is compacted instead of dropped:
-- its survivors are copied, before the log is locked, into a new table with
-- the chunk's bounds, which then takes the chunk's place (DETACH, DROP,
-- ATTACH: catalog work, whatever the number of survivors). The chunk keeps
-- its name and its row in event_chunks; a later pass drops it once few of
-- its events are left. A drop that re-inserted every survivor under the
-- log's ACCESS EXCLUSIVE lock held every claim and publish for as long.

-- Before the log's lock, in the caller's transaction: the closed chunk's
-- events survivors, copied into chunk || '_next', a table like the log (its
-- indexes included, so that the attach builds none) with the chunk's bounds
-- as a CHECK constraint (so that the attach reads none of its rows). Events
-- are never updated, and the caller made sure that none arrives in the chunk
-- any more. Returns the number of events copied.
CREATE FUNCTION {schema}.compact_event_chunk(chunk text, survivors bigint[])
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    c {schema}.event_chunks;
    n bigint;
BEGIN
    SELECT * INTO STRICT c FROM {schema}.event_chunks WHERE name = chunk AND closed_at IS NOT NULL;
    EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.events INCLUDING ALL)', chunk || '_next');
    EXECUTE format('ALTER TABLE {schema}.%I ADD CONSTRAINT %I CHECK (id >= %s AND id < %s)',
                   chunk || '_next', chunk || '_bounds', c.lo, c.hi);
    EXECUTE format('INSERT INTO {schema}.%I SELECT * FROM {schema}.events '
                   'WHERE id >= $1 AND id < $2 AND id = ANY($3)', chunk || '_next')
        USING c.lo, c.hi, survivors;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Under the log's lock and the chunk's (lock_event_chunk), in the same
-- transaction: the chunk's table goes and its compacted copy takes its place
-- and name. The attach reads the default partition (events_kept) for rows of
-- the chunk's range (there are none: the range was the chunk's); nothing else.
CREATE FUNCTION {schema}.swap_event_chunk(chunk text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    c {schema}.event_chunks;
BEGIN
    SELECT * INTO STRICT c FROM {schema}.event_chunks WHERE name = chunk AND closed_at IS NOT NULL;
    EXECUTE format('ALTER TABLE {schema}.events DETACH PARTITION {schema}.%I', chunk);
    EXECUTE format('DROP TABLE {schema}.%I', chunk);
    EXECUTE format('ALTER TABLE {schema}.%I RENAME TO %I', chunk || '_next', chunk);
    EXECUTE format('ALTER TABLE {schema}.events ATTACH PARTITION {schema}.%I FOR VALUES FROM (%s) TO (%s)',
                   chunk, c.lo, c.hi);
END $$;
