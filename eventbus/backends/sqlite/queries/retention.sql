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
