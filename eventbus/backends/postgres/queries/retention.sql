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

-- name: prune_batch
-- One batch of the retention walk: the next $2 events after $1 in primary key
-- order (a bounded range read), their deliveries finished before their
-- retention cutoff ($3 completed/cancelled, $4 dead, in seconds; NULL keeps
-- them; a subscription named in $7 has its own cutoffs $8, $9; $10 is the
-- shortest cutoff of all) with their attempt history, then the events of the batch older than
-- $3 and, when keyed, than the dedup window $5, with no delivery left (only
-- when $11: this batch holds prune_backfill_guard). A
-- pending, processing or retained dead delivery keeps its event. Rows another
-- transaction holds (a replay) are skipped, never waited for. Data-modifying
-- CTEs share one snapshot, so the deliveries deleted here are excluded by id.
WITH batch AS (
    SELECT id, key, created_at FROM {schema}.events WHERE id > $1 ORDER BY id LIMIT $2
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
), events_doomed AS (
    SELECT b.id FROM batch b
    WHERE $11 AND $3::float8 IS NOT NULL AND b.created_at < now() - $3 * interval '1 second'
      AND (b.key IS NULL OR b.created_at < now() - $5 * interval '1 second')
      AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                      WHERE d.event_id = b.id AND d.id NOT IN (SELECT id FROM doomed))
), events_gone AS (
    DELETE FROM {schema}.events e USING events_doomed x WHERE e.id = x.id AND NOT $6
    RETURNING e.id
)
SELECT (SELECT max(id) FROM batch) AS last_id,
       (SELECT min(created_at) >= now() - coalesce($10::float8, 0) * interval '1 second'
        FROM batch) AS young,
       (SELECT count(*) FROM doomed WHERE status <> 'dead') AS completed,
       (SELECT count(*) FROM doomed WHERE status = 'dead') AS dead,
       (SELECT count(*) FROM history) AS attempts,
       (SELECT count(*) FROM events_doomed) AS events;

-- name: prune_record
INSERT INTO {schema}.maintenance (name, ran_at, report) VALUES ('prune', now(), $1::jsonb)
ON CONFLICT (name) DO UPDATE SET ran_at = now(), report = EXCLUDED.report;
