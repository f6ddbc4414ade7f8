-- Schedules of the PostgreSQL backend (PgSchedules). {schema} is the validated,
-- quoted schema.

-- name: schedule_rows_locked
-- Declaring schedules: lock the named rows so two starting workers apply
-- their declarations one after the other.
SELECT *, now() AS db_now FROM {schema}.schedules WHERE name = ANY($1::text[]) ORDER BY name FOR UPDATE;

-- name: schedule_now
SELECT now();

-- name: schedule_declare
-- Create, or update spec and policies in place, one statement for all of a
-- process's schedules. The caller passes the old next occurrence where the
-- times stay, a new one where the spec changed; recorded occurrences stay.
INSERT INTO {schema}.schedules AS s (name, target_kind, target, cron, every_seconds, anchor, timezone,
    missed, max_catchup, overlap, cooldown_seconds, jitter_seconds, dst_gap, dst_fold,
    next_occurrence_at, next_run_at)
SELECT name, target_kind, target, cron, every_seconds, anchor, timezone, missed, max_catchup, overlap,
       cooldown_seconds, jitter_seconds, dst_gap, dst_fold, first, first
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::timestamptz[], $7::text[],
            $8::text[], $9::int[], $10::text[], $11::float8[], $12::float8[], $13::text[], $14::text[],
            $15::timestamptz[])
    AS t(name, target_kind, target, cron, every_seconds, anchor, timezone, missed, max_catchup, overlap,
         cooldown_seconds, jitter_seconds, dst_gap, dst_fold, first)
ON CONFLICT (name) DO UPDATE SET
    target_kind = EXCLUDED.target_kind, target = EXCLUDED.target, cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds, anchor = EXCLUDED.anchor, timezone = EXCLUDED.timezone,
    missed = EXCLUDED.missed, max_catchup = EXCLUDED.max_catchup, overlap = EXCLUDED.overlap,
    cooldown_seconds = EXCLUDED.cooldown_seconds, jitter_seconds = EXCLUDED.jitter_seconds,
    dst_gap = EXCLUDED.dst_gap, dst_fold = EXCLUDED.dst_fold,
    next_occurrence_at = CASE WHEN s.next_occurrence_at = EXCLUDED.next_occurrence_at THEN s.next_occurrence_at
                              ELSE EXCLUDED.next_occurrence_at END,
    next_run_at = CASE WHEN s.next_occurrence_at = EXCLUDED.next_occurrence_at THEN s.next_run_at
                       ELSE EXCLUDED.next_run_at END,
    updated_at = now();

-- name: schedule_set_known
SELECT 1 FROM {schema}.schedule_sets WHERE set_id = $1;

-- name: schedule_set_record
-- The names of a declaration set (content-addressed: written once per set).
WITH s AS (
    INSERT INTO {schema}.schedule_sets (set_id) VALUES ($1) ON CONFLICT (set_id) DO NOTHING
)
INSERT INTO {schema}.schedule_declarations (set_id, name)
SELECT $1, unnest($2::text[])
ON CONFLICT DO NOTHING;

-- name: schedule_claim
-- The tick: lock up to $2 due schedules of this process's declaration set,
-- skipping those another worker is ticking; time is the database's. The set
-- is a correlated subquery, not EXISTS, so it stays a primary-key probe per
-- due row of schedules_due: as a semi-join the planner may start from the
-- set's rows, all of them, when statistics are stale.
SELECT s.*, now() AS db_now FROM {schema}.schedules s
WHERE s.next_run_at <= now() AND (s.paused_at IS NULL OR s.requested)
  AND (SELECT true FROM {schema}.schedule_declarations d WHERE d.set_id = $1 AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT $2
FOR UPDATE OF s SKIP LOCKED;

-- name: schedule_work_open
-- Whether the last fired events' work has finished: every delivery terminal.
-- An event missing here has no delivery (no subscriber): nothing to wait for.
SELECT event_id, count(*) FILTER (WHERE status IN ('pending', 'processing')) AS open,
       max(updated_at) AS last
FROM {schema}.deliveries WHERE event_id = ANY($1::bigint[])
GROUP BY event_id;

-- name: schedule_finished
-- Record when the last firings' work finished, on the schedules and their occurrences.
WITH t AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS t(name, event_id, finished)
), occ AS (
    UPDATE {schema}.schedule_occurrences o SET finished_at = t.finished
    FROM t
    WHERE o.schedule = t.name AND o.event_id = t.event_id AND o.status = 'fired' AND o.finished_at IS NULL
)
UPDATE {schema}.schedules s SET last_finished_at = t.finished
FROM t
WHERE s.name = t.name AND s.last_event_id = t.event_id AND s.last_finished_at IS NULL;

-- name: schedule_requested
-- Triggered or backfilled occurrences waiting to fire, at most $2 per schedule.
SELECT schedule, scheduled_for FROM (
    SELECT schedule, scheduled_for,
           row_number() OVER (PARTITION BY schedule ORDER BY scheduled_for) AS rank
    FROM {schema}.schedule_occurrences
    WHERE schedule = ANY($1::text[]) AND status = 'requested') r
WHERE rank <= $2
ORDER BY schedule, scheduled_for;

-- name: occurrences_insert
-- New occurrences with their fate; a time already recorded keeps its row.
INSERT INTO {schema}.schedule_occurrences (schedule, scheduled_for, status, event_id, fired_at)
SELECT t.name, t.at, t.status, t.event_id, CASE WHEN t.status = 'fired' THEN now() END
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bigint[]) AS t(name, at, status, event_id)
ON CONFLICT (schedule, scheduled_for) DO NOTHING;

-- name: occurrences_fire
-- Requested or buffered occurrences fire now (guarded by their status).
UPDATE {schema}.schedule_occurrences o
SET status = 'fired', event_id = t.event_id, fired_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) AS t(name, at, event_id)
WHERE o.schedule = t.name AND o.scheduled_for = t.at AND o.status IN ('requested', 'buffered');

-- name: schedule_advance
-- Move the schedules on, each guarded by the occurrence it was claimed at
-- (the row locks make the tick the only writer; the guard says so).
UPDATE {schema}.schedules s
SET next_occurrence_at = t.next_occurrence_at, next_run_at = t.next_run_at,
    buffered_for = t.buffered_for,
    last_run_at = CASE WHEN t.last_event_id IS NULL THEN s.last_run_at ELSE now() END,
    last_event_id = coalesce(t.last_event_id, s.last_event_id),
    last_finished_at = CASE WHEN t.last_event_id IS NULL THEN s.last_finished_at END,
    requested = t.requested, updated_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[],
            $6::bigint[], $7::bool[])
    AS t(name, claimed_at, next_occurrence_at, next_run_at, buffered_for, last_event_id, requested)
WHERE s.name = t.name AND s.next_occurrence_at = t.claimed_at
RETURNING s.name;

-- name: schedule_next_due
-- Seconds until the earliest schedule of this process's set is due: the
-- first row of schedules_due that belongs to the set (probed as in the claim).
SELECT extract(epoch FROM s.next_run_at - now())::float8 FROM {schema}.schedules s
WHERE (s.paused_at IS NULL OR s.requested)
  AND (SELECT true FROM {schema}.schedule_declarations d WHERE d.set_id = $1 AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT 1;

-- name: schedules_list
SELECT * FROM {schema}.schedules WHERE $1::text IS NULL OR name = $1 ORDER BY name;

-- name: occurrences_list
-- Newest first; a fired occurrence whose finish the tick has not recorded yet
-- is computed from its deliveries (finished = every delivery terminal).
SELECT o.schedule, o.scheduled_for, o.status, o.event_id, o.fired_at,
       coalesce(o.finished_at, w.finished_at) AS finished_at
FROM {schema}.schedule_occurrences o
LEFT JOIN LATERAL (
    SELECT CASE WHEN count(*) FILTER (WHERE d.status IN ('pending', 'processing')) = 0
                THEN coalesce(max(d.updated_at), o.fired_at) END AS finished_at
    FROM {schema}.deliveries d WHERE d.event_id = o.event_id
) w ON o.status = 'fired'
WHERE o.schedule = $1
ORDER BY o.scheduled_for DESC
LIMIT $2;

-- name: schedule_pause
UPDATE {schema}.schedules
SET paused_at = CASE WHEN $2 THEN coalesce(paused_at, now()) END, updated_at = now()
WHERE name = $1
RETURNING name;

-- name: schedule_remove
WITH gone AS (
    DELETE FROM {schema}.schedules WHERE name = $1 RETURNING name
), occ AS (
    DELETE FROM {schema}.schedule_occurrences o USING gone WHERE o.schedule = gone.name
)
SELECT count(*) FROM gone;

-- name: schedule_request
-- An operator asked for occurrences: lock the schedule and have the next tick
-- look at it now. Returns the database time (a trigger fires at it).
UPDATE {schema}.schedules
SET requested = true, next_run_at = least(next_run_at, now()), updated_at = now()
WHERE name = $1
RETURNING now() AS db_now;

-- name: occurrences_request
-- Record requested occurrences; skipped ones are requested again, fired or
-- waiting ones are left alone (each fires at most once).
INSERT INTO {schema}.schedule_occurrences AS o (schedule, scheduled_for, status)
SELECT $1, t.at, 'requested' FROM unnest($2::timestamptz[]) AS t(at)
ON CONFLICT (schedule, scheduled_for) DO UPDATE SET status = 'requested'
    WHERE o.status IN ('skipped_missed', 'skipped_overlap')
RETURNING o.scheduled_for;
