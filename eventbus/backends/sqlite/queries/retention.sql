-- Retention of the SQLite backend (the RetentionStore port): one batch of the
-- walk per write transaction. Conventions as in delivery.sql.

-- name: prune_events
-- The next batch of the retention walk, in primary key order (a bounded range read).
SELECT id, key, created_at FROM events WHERE id > :after ORDER BY id LIMIT :limit;

-- name: prune_doomed
-- Deliveries of the batch finished before their retention cutoff (NULL keeps
-- them): the subscription's own cutoffs when :overrides (JSON [name,
-- completed, dead] triples) names it, else the bus's.
SELECT d.id, d.status
FROM deliveries d
JOIN subscriptions s ON s.id = d.subscription_id
LEFT JOIN (SELECT json_extract(value, '$[0]') AS name, json_extract(value, '$[1]') AS completed,
                  json_extract(value, '$[2]') AS dead
           FROM json_each(:overrides)) o ON o.name = s.name
WHERE d.event_id IN (SELECT value FROM json_each(:event_ids))
  AND ((d.status IN ('completed', 'cancelled')
        AND CASE WHEN o.name IS NULL THEN :completed ELSE o.completed END IS NOT NULL
        AND d.updated_at < :now - CASE WHEN o.name IS NULL THEN :completed ELSE o.completed END)
    OR (d.status = 'dead'
        AND CASE WHEN o.name IS NULL THEN :dead ELSE o.dead END IS NOT NULL
        AND d.updated_at < :now - CASE WHEN o.name IS NULL THEN :dead ELSE o.dead END));

-- name: prune_history
DELETE FROM delivery_attempts WHERE delivery_id IN (SELECT value FROM json_each(:ids));

-- name: prune_deliveries
DELETE FROM deliveries WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN ('completed', 'cancelled', 'dead');

-- name: prune_events_doomed
-- Events of the batch old enough, outside the dedup window when keyed, and
-- with no delivery left but those about to go: a pending, processing or
-- retained dead delivery keeps its event.
SELECT e.id FROM events e
WHERE e.id IN (SELECT value FROM json_each(:event_ids))
  AND :completed IS NOT NULL AND e.created_at < :now - :completed
  AND (e.key IS NULL OR e.created_at < :now - :dedup)
  AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id
                  AND d.id NOT IN (SELECT value FROM json_each(:doomed)));

-- name: prune_delete_events
DELETE FROM events WHERE id IN (SELECT value FROM json_each(:ids));

-- name: prune_record
INSERT INTO maintenance (name, ran_at, report) VALUES ('prune', :now, :report)
ON CONFLICT (name) DO UPDATE SET ran_at = excluded.ran_at, report = excluded.report;

-- name: prune_occurrences_batch
-- The next batch of the walk over past schedule occurrences, after the cursor
-- (:after_at, :after_name; NULL from the oldest), in (scheduled_for, schedule)
-- order (a bounded range read of schedule_occurrences_age); requested and
-- buffered ones wait to fire and stay.
SELECT schedule, scheduled_for FROM schedule_occurrences
WHERE scheduled_for < :now - :seconds AND status NOT IN ('requested', 'buffered')
  AND (:after_at IS NULL OR (scheduled_for, schedule) > (:after_at, :after_name))
ORDER BY scheduled_for, schedule
LIMIT :limit;

-- name: prune_occurrences_delete
-- The batch's occurrences (:keys, JSON [schedule, scheduled_for] pairs),
-- guarded by their status as read.
DELETE FROM schedule_occurrences
WHERE (schedule, scheduled_for) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                    FROM json_each(:keys))
  AND status NOT IN ('requested', 'buffered');

-- name: prune_workflows_batch
-- The next batch of the walk over finished workflow instances, after the
-- cursor (:after_at, :after_machine, :after_key; NULL from the oldest), in
-- (updated_at, machine, key) order (a bounded range read of wf_instances_finished).
SELECT machine, key, updated_at FROM wf_instances
WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < :now - :seconds
  AND NOT (status = 'completed' AND kept)  -- a started-once key that completed holds for good
  AND (:after_at IS NULL OR (updated_at, machine, key) > (:after_at, :after_machine, :after_key))
ORDER BY updated_at, machine, key
LIMIT :limit;

-- name: prune_workflows_rows
-- How many history, signal, effect, approval and child-link rows the instances of :keys
-- (JSON [machine, key] pairs) have.
WITH k AS (SELECT json_extract(value, '$[0]') AS machine, json_extract(value, '$[1]') AS key
           FROM json_each(:keys))
SELECT (SELECT count(*) FROM wf_history x JOIN k USING (machine, key))
     + (SELECT count(*) FROM wf_signals x JOIN k USING (machine, key))
     + (SELECT count(*) FROM wf_effects x JOIN k USING (machine, key))
     + (SELECT count(*) FROM wf_approvals x JOIN k USING (machine, key))
     + (SELECT count(*) FROM wf_children x JOIN k
          ON x.parent_machine = k.machine AND x.parent_key = k.key) AS n;

-- name: prune_workflows_history
DELETE FROM wf_history WHERE (machine, key) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keys));

-- name: prune_workflows_signals
DELETE FROM wf_signals WHERE (machine, key) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keys));

-- name: prune_workflows_effects
DELETE FROM wf_effects WHERE (machine, key) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keys));

-- name: prune_workflows_approvals
DELETE FROM wf_approvals WHERE (machine, key) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keys));

-- name: prune_workflows_children
-- The links the pruned runs made as parents: the outcomes their children left.
DELETE FROM wf_children WHERE (parent_machine, parent_key) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keys));

-- name: prune_workflows_instances
DELETE FROM wf_instances WHERE (machine, key) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keys));

-- name: prune_audit_batch
-- The next batch of the walk over the audit trail, after the cursor
-- (:after_at, :after_id; NULL from the oldest), in (at, id) order (a bounded
-- range read of audit_log_at).
SELECT id, at FROM audit_log
WHERE at < :now - :seconds
  AND (:after_at IS NULL OR (at, id) > (:after_at, :after_id))
ORDER BY at, id
LIMIT :limit;

-- name: prune_audit_delete
-- The batch's rows (:ids, a JSON array of ids), by primary key.
DELETE FROM audit_log WHERE id IN (SELECT value FROM json_each(:ids));

-- name: prune_rollup_batch
-- The next batch of the walk over the throughput rollup, after the cursor
-- (:after_minute, :after_id; NULL from the oldest), in (minute, id) order, of
-- minutes more than :seconds ago (a bounded range read of throughput_rollup_minute).
SELECT id, minute FROM throughput_rollup
WHERE minute < :now - :seconds
  AND (:after_minute IS NULL OR (minute, id) > (:after_minute, :after_id))
ORDER BY minute, id
LIMIT :limit;

-- name: prune_rollup_delete
-- The batch's rows (:ids, a JSON array of ids), by primary key.
DELETE FROM throughput_rollup WHERE id IN (SELECT value FROM json_each(:ids));

