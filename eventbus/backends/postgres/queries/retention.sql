-- Retention of the PostgreSQL backend (PgRetention). {schema} is the validated,
-- quoted schema.

-- name: prune_try_lock
-- One pruner at a time per schema (a session lock, released after the pass).
SELECT pg_try_advisory_lock(hashtext($1 || ':prune'));

-- name: prune_unlock
SELECT pg_advisory_unlock(hashtext($1 || ':prune'));

-- name: prune_backfill_guard
-- May this batch delete events? Only while no transaction that backfills a
-- new subscription is open (backfill_guard): its deliveries are invisible here
-- until it commits. Tried, never waited for: a batch that does not get it
-- deletes deliveries only and leaves the events for the next pass.
SELECT pg_try_advisory_xact_lock(hashtext($1 || ':backfill'));

-- name: prune_try_xact_lock
-- The same lock behind a transaction pooler, where a session lock would stay
-- on whichever server connection took it and its unlock go to another:
-- transaction-scoped, in a transaction kept open for the pass (the
-- transaction keeps its server connection), ended with it however the pass ends.
SELECT pg_try_advisory_xact_lock(hashtext($1 || ':prune'));

-- name: prune_lock_touch
-- Before each batch, on the lock's open transaction: it is never idle for
-- longer than a batch, so an idle-in-transaction timeout of the server or the
-- pooler does not end it mid-pass. A statement's snapshot ends with it.
SELECT 1;

-- name: prune_batch
-- One batch of the retention walk: the next $2 events after $1 in primary key
-- order (a bounded range read), their deliveries finished before their
-- retention cutoff ($3 completed/cancelled, $4 dead, in seconds; NULL keeps
-- them; a subscription named in $7 has its own cutoffs $8, $9; $10 is the
-- shortest cutoff of all) with their attempt history, then, of the events
-- that outlived their chunk (events_kept: chunks themselves go whole, see
-- chunk_survivors), those older than $3 and, when keyed, than the dedup
-- window $5, with no delivery left, with their keys (only when $11: this
-- batch holds prune_backfill_guard). A
-- pending, processing or retained dead delivery keeps its event (so does a
-- delivery in the append-only ring; a completed one there is history in the
-- outcome log, whose days go by DROP: see ring_drop_days). Rows another
-- transaction holds (a replay) are skipped, never waited for. Data-modifying
-- CTEs share one snapshot, so the deliveries deleted here are excluded by id.
WITH batch AS (
    SELECT id, key, created_at, tableoid FROM {schema}.events WHERE id > $1 ORDER BY id LIMIT $2
), overrides AS (
    SELECT s.id, o.completed, o.dead
    FROM unnest($7::text[], $8::float8[], $9::float8[]) AS o(name, completed, dead)
    JOIN {schema}.subscriptions s ON s.name = o.name
), doomed AS (
    SELECT d.id, d.status
    FROM {schema}.deliveries d
    JOIN batch b ON d.event_id = b.id
    LEFT JOIN overrides o ON o.id = d.subscription_id
    CROSS JOIN LATERAL (
        SELECT CASE WHEN o.id IS NULL THEN $3::float8 ELSE o.completed END AS completed,
               CASE WHEN o.id IS NULL THEN $4::float8 ELSE o.dead END AS dead) r
    WHERE (d.status IN ('completed', 'cancelled') AND r.completed IS NOT NULL
           AND d.updated_at < now() - r.completed * interval '1 second')
       OR (d.status = 'dead' AND r.dead IS NOT NULL
           AND d.updated_at < now() - r.dead * interval '1 second')
    FOR UPDATE OF d SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.deliveries d USING doomed
    WHERE d.id = doomed.id AND d.status = doomed.status AND NOT $6
    RETURNING d.id, d.status
), history AS (
    DELETE FROM {schema}.delivery_attempts a USING gone WHERE a.delivery_id = gone.id
    RETURNING 1
), kept AS (
    SELECT b.id, b.key, b.created_at FROM batch b
    WHERE $11 AND b.tableoid = '{schema}.events_kept'::regclass
), in_ring AS MATERIALIZED (
    -- The kept events of the batch with a delivery in the append-only ring with no outcome
    -- yet: ring_ready has no index on event_id, so it is read once per batch (and not at all
    -- for a batch without kept events), never once per kept event.
    SELECT r.event_id FROM {schema}.ring_ready r
    WHERE EXISTS (SELECT 1 FROM kept)
      AND r.event_id >= (SELECT min(id) FROM kept) AND r.event_id <= (SELECT max(id) FROM kept)
      AND {_ring_unsettled}
), events_doomed AS (
    SELECT b.id FROM kept b
    WHERE $3::float8 IS NOT NULL AND b.created_at < now() - $3 * interval '1 second'
      AND (b.key IS NULL OR b.created_at < now() - $5 * interval '1 second')
      AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                      WHERE d.event_id = b.id AND d.id NOT IN (SELECT id FROM doomed))
      -- nor a delivery in the append-only ring with no outcome yet (a bounded table)
      AND b.id NOT IN (SELECT event_id FROM in_ring)
), events_gone AS (
    DELETE FROM {schema}.events_kept e USING events_doomed x WHERE e.id = x.id AND NOT $6
    RETURNING e.id, e.event_type, e.key
), keys_gone AS (
    DELETE FROM {schema}.event_keys k USING events_gone g
    WHERE k.event_type = g.event_type AND k.key = g.key AND k.event_id = g.id
)
SELECT (SELECT max(id) FROM batch) AS last_id,
       (SELECT min(created_at) >= now() - coalesce($10::float8, 0) * interval '1 second'
        FROM batch) AS young,
       (SELECT count(*) FROM doomed WHERE status <> 'dead') AS completed,
       (SELECT count(*) FROM doomed WHERE status = 'dead') AS dead,
       (SELECT count(*) FROM history) AS attempts,
       (SELECT count(*) FROM events_doomed) AS events;

-- name: rotate_chunks
-- Close the open chunk of the event log when it is older than $2 seconds or
-- more than $3 full, and keep a chunk of $1 ids created ahead (see
-- rotate_event_chunks in the migration that partitions the log). The name of
-- the chunk closed, or NULL.
SELECT {schema}.rotate_event_chunks($1, $2, $3);

-- name: chunks_past
-- The closed chunks closed more than $1 seconds ago (every event in one is
-- at least that old), oldest first: those retention may drop.
SELECT name, lo, hi, closed_at FROM {schema}.event_chunks
WHERE closed_at < now() - $1::float8 * interval '1 second'
ORDER BY lo;

-- name: fence_event_log
-- Wait, in a transaction of its own, for every publish in flight to end,
-- before a closed chunk's keys are walked and its survivors read: a publish draws its event's id
-- in the statement that inserts it, which holds the log's parent (ROW
-- EXCLUSIVE) from before the id is drawn to its commit, so once this is
-- granted no event can still arrive in a chunk that closed before. SHARE
-- conflicts with writers only: claims and other readers (ACCESS SHARE) are
-- neither waited for nor held up; publishes queue behind it while it waits
-- (at most its lock_timeout), not after it is granted (the transaction ends).
LOCK TABLE ONLY {schema}.events IN SHARE MODE;

-- name: lock_event_log
-- The event log's parent, for a chunk's drop, after its survivors are read
-- and copied (chunk_keep, compact_chunk) and before the chunk is locked: every
-- statement that reads the log (a claim's join) locks the parent first and
-- then each chunk, and the drop's DROP TABLE needs the parent too. Taken in
-- the other order, a claim holding the parent and waiting for the chunk and
-- the drop holding the chunk and waiting for the parent wait for each other
-- until the drop's lock_timeout ends it (the drop then never gets through a
-- steady load). Every claim and publish waits while this is held or queued:
-- only the DROP and the survivors' re-insert (at most a thousand), or a
-- compacted chunk's swap (swap_event_chunk), run under it.
LOCK TABLE ONLY {schema}.events IN ACCESS EXCLUSIVE MODE;

-- name: lock_chunk
-- Lock a closed chunk for its drop; its bounds, or no row.
SELECT lo, hi, closed_at FROM {schema}.lock_event_chunk($1);

-- name: chunk_survivors
-- The events of the chunk [$1, $2) that must outlive it: those with a
-- delivery left (pending, processing, or finished but kept: read through the
-- deliveries' (event_id, subscription_id) index, a range read of the few
-- rows left), and the keyed ones inside the dedup window $4 (only read when
-- the chunk closed less than $4 ago, $3). On a dry run ($5), deliveries this
-- pass would delete (the cutoffs $6 completed, $7 dead, overridden for the
-- subscriptions $8 by $9, $10, as in prune_batch) do not keep their event.
-- At most $11 rows: past that many the chunk is pinned, whatever the count.
WITH overrides AS (
    SELECT s.id, o.completed, o.dead
    FROM unnest($8::text[], $9::float8[], $10::float8[]) AS o(name, completed, dead)
    JOIN {schema}.subscriptions s ON s.name = o.name
)
SELECT DISTINCT d.event_id AS id
FROM {schema}.deliveries d
LEFT JOIN overrides o ON o.id = d.subscription_id
CROSS JOIN LATERAL (
    SELECT CASE WHEN o.id IS NULL THEN $6::float8 ELSE o.completed END AS completed,
           CASE WHEN o.id IS NULL THEN $7::float8 ELSE o.dead END AS dead) r
WHERE d.event_id >= $1 AND d.event_id < $2
  AND NOT ($5 AND ((d.status IN ('completed', 'cancelled') AND r.completed IS NOT NULL
                    AND d.updated_at < now() - r.completed * interval '1 second')
                   OR (d.status = 'dead' AND r.dead IS NOT NULL
                       AND d.updated_at < now() - r.dead * interval '1 second')))
UNION
-- deliveries in the append-only ring with no outcome yet (a bounded table; a
-- completed one there is history in the outcome log and keeps nothing)
SELECT r.event_id FROM {schema}.ring_ready r
WHERE r.event_id >= $1 AND r.event_id < $2 AND {_ring_unsettled}
UNION
SELECT e.id FROM {schema}.events e
WHERE $3::timestamptz >= now() - $4::float8 * interval '1 second'
  AND e.id >= $1 AND e.id < $2 AND e.key IS NOT NULL
  AND e.created_at >= now() - $4::float8 * interval '1 second'
LIMIT $11;

-- name: chunk_size
-- The events of the chunk [$1, $2), read before it is locked (it is closed:
-- only a publish that drew its id before it closed may still add one).
SELECT count(*) FROM {schema}.events WHERE id >= $1 AND id < $2;

-- name: chunk_forget_keys
-- One batch of the walk over a closed chunk before its drop, outside the
-- drop's lock: the next $3 events after $1 below $2 (a range read of the
-- chunk's primary key), and the keys of those that will go with it: older
-- than the dedup window $4 and without a delivery (the others stay with
-- their keys). The last id read, NULL at the end of the chunk.
WITH batch AS (
    SELECT id, event_type, key, created_at FROM {schema}.events
    WHERE id > $1 AND id < $2 ORDER BY id LIMIT $3
), gone AS (
    DELETE FROM {schema}.event_keys k USING batch b
    WHERE b.key IS NOT NULL AND b.created_at < now() - $4::float8 * interval '1 second'
      AND k.event_type = b.event_type AND k.key = b.key AND k.event_id = b.id
      AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d WHERE d.event_id = b.id)
      AND NOT EXISTS (SELECT 1 FROM {schema}.ring_ready r WHERE r.event_id = b.id AND {_ring_unsettled})
)
SELECT max(id) FROM batch;

-- name: chunk_keep
-- The rows of the survivors $3 of the chunk [$1, $2) (read by
-- chunk_survivors in this transaction), read before the log's lock: events
-- are never updated, and none arrives in the chunk any more
-- (fence_event_log), so these are the rows the drop must keep. A range read
-- of the chunk's primary key; NULL for none.
SELECT array_agg(e ORDER BY e.id) FROM {schema}.events e
WHERE e.id >= $1 AND e.id < $2 AND e.id = ANY($3::bigint[]);

-- name: drop_chunk
-- Drop the locked chunk $1 and keep nothing of it (see drop_event_chunk):
-- its survivors come back from their copy (chunk_kept_back) in the same
-- transaction, so no reader ever misses one.
SELECT {schema}.drop_event_chunk($1, ARRAY[]::bigint[]);

-- name: chunk_kept_back
-- The survivors' rows $1 read by chunk_keep, back into the log (events_kept,
-- the default partition, now that their chunk is gone) under their own ids.
INSERT INTO {schema}.events SELECT (k).* FROM unnest($1::{schema}.events[]) AS k;

-- name: compact_chunk
-- Copy the survivors $2 of the closed chunk $1 into the table that will take
-- its place (see compact_event_chunk), before the log's lock; the number copied.
SELECT {schema}.compact_event_chunk($1, $2::bigint[]);

-- name: swap_chunk
-- The locked chunk $1 goes, its compacted copy takes its place (see swap_event_chunk).
SELECT {schema}.swap_event_chunk($1);

-- name: prune_record
INSERT INTO {schema}.maintenance (name, ran_at, report) VALUES ('prune', now(), $1::jsonb)
ON CONFLICT (name) DO UPDATE SET ran_at = now(), report = EXCLUDED.report;

-- name: prune_occurrences
-- One batch of the walk over past schedule occurrences: the next $3 after
-- the cursor ($1, $2; NULL from the oldest) in (scheduled_for, schedule)
-- order scheduled more than $4 seconds ago and not waiting to fire (requested
-- and buffered ones stay), a bounded range read of schedule_occurrences_age.
-- Rows another transaction holds (a tick, a backfill) are skipped, and the
-- conditions are checked again on each row locked, so one a backfill requests
-- again meanwhile stays. $5: a dry run, which deletes nothing.
WITH doomed AS (
    SELECT schedule, scheduled_for FROM {schema}.schedule_occurrences
    WHERE scheduled_for < now() - $4::float8 * interval '1 second'
      AND status NOT IN ('requested', 'buffered')
      AND ($1::timestamptz IS NULL OR (scheduled_for, schedule) > ($1::timestamptz, $2::text))
    ORDER BY scheduled_for, schedule
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.schedule_occurrences o USING doomed d
    WHERE o.schedule = d.schedule AND o.scheduled_for = d.scheduled_for AND NOT $5
    RETURNING 1
), last AS (
    SELECT scheduled_for, schedule FROM doomed ORDER BY scheduled_for DESC, schedule DESC LIMIT 1
)
SELECT (SELECT count(*) FROM doomed) AS occurrences,
       (SELECT scheduled_for FROM last) AS last_at,
       (SELECT schedule FROM last) AS last_name;

-- name: prune_workflows
-- One batch of the walk over finished workflow instances: the next $4 after
-- the cursor ($1, $2, $3; NULL from the oldest) in (updated_at, machine, key)
-- order that finished (completed, failed or cancelled) more than $5 seconds
-- ago, a bounded range read of wf_instances_finished. Each goes with its
-- history, signals, effects, approvals and child links in this one statement, so a later
-- start of the key begins from nothing. Rows another transaction holds are
-- skipped, and the conditions are checked again on each row locked: an
-- instance started again meanwhile stays. $6: a dry run, which deletes
-- nothing (the data-modifying CTEs run whether or not the final SELECT reads
-- them; the counts read the rows as they were before).
WITH doomed AS (
    SELECT machine, key, updated_at FROM {schema}.wf_instances
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND NOT (status = 'completed' AND kept)  -- a started-once key that completed holds for good
      AND updated_at < now() - $5::float8 * interval '1 second'
      AND ($1::timestamptz IS NULL
           OR (updated_at, machine, key) > ($1::timestamptz, $2::text, $3::text))
    ORDER BY updated_at, machine, key
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), counted AS (
    SELECT (SELECT count(*) FROM {schema}.wf_history x JOIN doomed d USING (machine, key))
         + (SELECT count(*) FROM {schema}.wf_signals x JOIN doomed d USING (machine, key))
         + (SELECT count(*) FROM {schema}.wf_effects x JOIN doomed d USING (machine, key))
         + (SELECT count(*) FROM {schema}.wf_approvals x JOIN doomed d USING (machine, key))
         + (SELECT count(*) FROM {schema}.wf_children x JOIN doomed d
              ON x.parent_machine = d.machine AND x.parent_key = d.key) AS n
), history AS (
    DELETE FROM {schema}.wf_history x USING doomed d
    WHERE x.machine = d.machine AND x.key = d.key AND NOT $6
), signals AS (
    DELETE FROM {schema}.wf_signals x USING doomed d
    WHERE x.machine = d.machine AND x.key = d.key AND NOT $6
), effects AS (
    DELETE FROM {schema}.wf_effects x USING doomed d
    WHERE x.machine = d.machine AND x.key = d.key AND NOT $6
), approvals AS (
    DELETE FROM {schema}.wf_approvals x USING doomed d
    WHERE x.machine = d.machine AND x.key = d.key AND NOT $6
), children AS (
    DELETE FROM {schema}.wf_children x USING doomed d
    WHERE x.parent_machine = d.machine AND x.parent_key = d.key AND NOT $6
), instances AS (
    DELETE FROM {schema}.wf_instances x USING doomed d
    WHERE x.machine = d.machine AND x.key = d.key AND NOT $6
), last AS (
    SELECT updated_at, machine, key FROM doomed ORDER BY updated_at DESC, machine DESC, key DESC LIMIT 1
)
SELECT (SELECT count(*) FROM doomed) AS instances,
       (SELECT n FROM counted) AS rows,
       (SELECT updated_at FROM last) AS last_at,
       (SELECT machine FROM last) AS last_machine,
       (SELECT key FROM last) AS last_key;

-- name: prune_audit
-- One batch of the walk over the audit trail: the next $3 rows after the
-- cursor ($1, $2; NULL from the oldest) in (at, id) order recorded more than
-- $4 seconds ago, a bounded range read of audit_log_at. Rows are only ever
-- inserted, so no lock is contended. $5: a dry run, which deletes nothing.
WITH doomed AS (
    SELECT id, at FROM {schema}.audit_log
    WHERE at < now() - $4::float8 * interval '1 second'
      AND ($1::timestamptz IS NULL OR (at, id) > ($1::timestamptz, $2::bigint))
    ORDER BY at, id
    LIMIT $3
), gone AS (
    DELETE FROM {schema}.audit_log a USING doomed d WHERE a.id = d.id AND NOT $5
    RETURNING 1
), last AS (
    SELECT at, id FROM doomed ORDER BY at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM doomed) AS rows,
       (SELECT at FROM last) AS last_at,
       (SELECT id FROM last) AS last_id;

-- name: prune_rollup
-- One batch of the walk over the throughput rollup: the next $3 rows after
-- the cursor ($1, $2; NULL from the oldest) in (minute, id) order, of minutes
-- more than $4 seconds ago: a bounded range read of throughput_rollup_minute.
-- Rows are only ever inserted, so no lock is contended. $5: a dry run, which
-- deletes nothing.
WITH doomed AS (
    SELECT id, minute FROM {schema}.throughput_rollup
    WHERE minute < now() - $4::float8 * interval '1 second'
      AND ($1::timestamptz IS NULL OR (minute, id) > ($1::timestamptz, $2::bigint))
    ORDER BY minute, id
    LIMIT $3
), gone AS (
    DELETE FROM {schema}.throughput_rollup r USING doomed d WHERE r.id = d.id AND NOT $5
    RETURNING 1
), last AS (
    SELECT minute, id FROM doomed ORDER BY minute DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM doomed) AS rows,
       (SELECT minute FROM last) AS last_minute,
       (SELECT id FROM last) AS last_id;

