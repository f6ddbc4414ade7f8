-- Schedules of the SQLite backend (the ScheduleStore port). Conventions as in
-- delivery.sql.

-- name: schedule_rows
-- Declaring schedules: read under the write lock, so two starting workers
-- apply their declarations one after the other.
SELECT * FROM schedules WHERE name IN (SELECT value FROM json_each(:names)) ORDER BY name;

-- name: schedule_declare
-- Create, or update spec and policies in place; the times restart only when
-- :reset says so, recorded occurrences stay.
INSERT INTO schedules (name, target_kind, target, cron, every_seconds, anchor, timezone,
    missed, max_catchup, overlap, cooldown_seconds, jitter_seconds, dst_gap, dst_fold,
    next_occurrence_at, next_run_at, created_at, updated_at)
VALUES (:name, :target_kind, :target, :cron, :every_seconds, :anchor, :timezone,
    :missed, :max_catchup, :overlap, :cooldown_seconds, :jitter_seconds, :dst_gap, :dst_fold,
    :first, :first, :now, :now)
ON CONFLICT (name) DO UPDATE SET
    target_kind = excluded.target_kind, target = excluded.target, cron = excluded.cron,
    every_seconds = excluded.every_seconds, anchor = excluded.anchor, timezone = excluded.timezone,
    missed = excluded.missed, max_catchup = excluded.max_catchup, overlap = excluded.overlap,
    cooldown_seconds = excluded.cooldown_seconds, jitter_seconds = excluded.jitter_seconds,
    dst_gap = excluded.dst_gap, dst_fold = excluded.dst_fold,
    next_occurrence_at = CASE WHEN :reset THEN excluded.next_occurrence_at ELSE next_occurrence_at END,
    next_run_at = CASE WHEN :reset THEN excluded.next_run_at ELSE next_run_at END,
    updated_at = :now;

-- name: schedule_set_known
SELECT 1 FROM schedule_sets WHERE set_id = :set_id;

-- name: schedule_set_record
INSERT INTO schedule_sets (set_id, declared_at) VALUES (:set_id, :now) ON CONFLICT DO NOTHING;

-- name: schedule_set_name
INSERT INTO schedule_declarations (set_id, name) VALUES (:set_id, :name) ON CONFLICT DO NOTHING;

-- name: schedule_probe
-- Read outside any transaction: is a schedule of this process's declaration
-- set due? Spares the write lock when none is (schedules_due).
SELECT 1 FROM schedules s
WHERE s.next_run_at <= (julianday('now') - 2440587.5) * 86400.0
  AND (s.paused_at IS NULL OR s.requested = 1)
  AND EXISTS (SELECT 1 FROM schedule_declarations d WHERE d.set_id = :set_id AND d.name = s.name)
LIMIT 1;

-- name: schedule_claim
-- The tick, under the write lock (no other tick runs at once): up to :limit
-- due schedules of this process's declaration set (schedules_due, then one
-- primary-key probe per due row; time is the database's).
SELECT s.* FROM schedules s
WHERE s.next_run_at <= :now AND (s.paused_at IS NULL OR s.requested = 1)
  AND EXISTS (SELECT 1 FROM schedule_declarations d WHERE d.set_id = :set_id AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT :limit;

-- name: schedule_work_open
-- Whether the last fired event's work has finished: every delivery terminal.
SELECT count(*) FILTER (WHERE status IN ('pending', 'processing')) AS open, max(updated_at) AS last
FROM deliveries WHERE event_id = :event_id;

-- name: schedule_finished_occurrence
UPDATE schedule_occurrences SET finished_at = :finished
WHERE schedule = :name AND event_id = :event_id AND status = 'fired' AND finished_at IS NULL;

-- name: schedule_finished
UPDATE schedules SET last_finished_at = :finished
WHERE name = :name AND last_event_id = :event_id AND last_finished_at IS NULL;

-- name: schedule_requested
SELECT scheduled_for FROM schedule_occurrences
WHERE schedule = :name AND status = 'requested'
ORDER BY scheduled_for
LIMIT :limit;

-- name: occurrence_insert
-- A new occurrence with its fate; a time already recorded keeps its row.
INSERT INTO schedule_occurrences (schedule, scheduled_for, status, event_id, fired_at, recorded_at)
VALUES (:name, :at, :status, :event_id, CASE WHEN :status = 'fired' THEN :now END, :now)
ON CONFLICT (schedule, scheduled_for) DO NOTHING;

-- name: occurrence_fire
-- A requested or buffered occurrence fires now (guarded by its status).
UPDATE schedule_occurrences SET status = 'fired', event_id = :event_id, fired_at = :now
WHERE schedule = :name AND scheduled_for = :at AND status IN ('requested', 'buffered');

-- name: schedule_advance
-- Move the schedule on, guarded by the occurrence it was claimed at.
UPDATE schedules
SET next_occurrence_at = :next_occurrence_at, next_run_at = :next_run_at,
    buffered_for = :buffered_for,
    last_run_at = CASE WHEN :last_event_id IS NULL THEN last_run_at ELSE :now END,
    last_event_id = coalesce(:last_event_id, last_event_id),
    last_finished_at = CASE WHEN :last_event_id IS NULL THEN last_finished_at END,
    requested = :requested, updated_at = :now
WHERE name = :name AND next_occurrence_at = :claimed_at
RETURNING name;

-- name: schedule_next_due
-- Seconds until the earliest schedule of the set is due: the first row of
-- schedules_due that belongs to it.
SELECT s.next_run_at - (julianday('now') - 2440587.5) * 86400.0 FROM schedules s
WHERE (s.paused_at IS NULL OR s.requested = 1)
  AND EXISTS (SELECT 1 FROM schedule_declarations d WHERE d.set_id = :set_id AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT 1;

-- name: schedules_list
SELECT * FROM schedules WHERE :name IS NULL OR name = :name ORDER BY name;

-- name: occurrences_list
-- Newest first; a fired occurrence whose finish the tick has not recorded yet
-- is computed from its deliveries (finished = every delivery terminal).
SELECT o.schedule, o.scheduled_for, o.status, o.event_id, o.fired_at,
       coalesce(o.finished_at, CASE WHEN o.status = 'fired' THEN (
           SELECT CASE WHEN count(*) FILTER (WHERE d.status IN ('pending', 'processing')) = 0
                       THEN coalesce(max(d.updated_at), o.fired_at) END
           FROM deliveries d WHERE d.event_id = o.event_id) END) AS finished_at
FROM schedule_occurrences o
WHERE o.schedule = :name
ORDER BY o.scheduled_for DESC
LIMIT :limit;

-- name: schedule_pause
UPDATE schedules
SET paused_at = CASE WHEN :paused THEN coalesce(paused_at, :now) END, updated_at = :now
WHERE name = :name
RETURNING name;

-- name: schedule_remove
DELETE FROM schedules WHERE name = :name RETURNING name;

-- name: schedule_remove_occurrences
DELETE FROM schedule_occurrences WHERE schedule = :name;

-- name: schedule_request
-- An operator asked for occurrences: have the next tick look at the schedule now.
UPDATE schedules
SET requested = 1, next_run_at = min(next_run_at, :now), updated_at = :now
WHERE name = :name
RETURNING name;

-- name: occurrence_request
-- Record a requested occurrence; a skipped one is requested again, a fired or
-- waiting one is left alone (each fires at most once).
INSERT INTO schedule_occurrences AS o (schedule, scheduled_for, status, recorded_at)
VALUES (:name, :at, 'requested', :now)
ON CONFLICT (schedule, scheduled_for) DO UPDATE SET status = 'requested'
    WHERE o.status IN ('skipped_missed', 'skipped_overlap')
RETURNING scheduled_for;
