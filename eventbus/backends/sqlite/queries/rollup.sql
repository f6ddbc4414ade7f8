-- The throughput rollup on SQLite (SQLiteRollup): inserts only.

-- name: rollup_record
-- One worker's counts, a JSON array of [subscription, minute, completed,
-- failed, dead, durations] (minute in epoch seconds, durations a JSON
-- object). A subscription the file does not know is dropped by the join.
-- Summed by the readers, never updated.
INSERT INTO throughput_rollup (minute, subscription_id, completed, failed, dead, durations)
SELECT json_extract(r.value, '$[1]'), s.id, json_extract(r.value, '$[2]'),
       json_extract(r.value, '$[3]'), json_extract(r.value, '$[4]'), json_extract(r.value, '$[5]')
FROM json_each(:rows) r
JOIN subscriptions s ON s.name = json_extract(r.value, '$[0]');

-- name: rollup_unsampled
-- A row when the minute :minute has no queue sample yet (one probe of
-- throughput_rollup_sample), so that only the first worker of a minute takes
-- the write lock and counts.
SELECT 1 WHERE NOT EXISTS (
    SELECT 1 FROM throughput_rollup WHERE minute = :minute AND pending IS NOT NULL);

-- name: rollup_sample
-- The queue sample of the minute :minute: each active or paused
-- subscription's pending deliveries, counted no further than :cap (a bounded
-- read of deliveries_pending), and the age of its oldest due one. A sample
-- already there is kept (throughput_rollup_sample).
INSERT OR IGNORE INTO throughput_rollup (minute, subscription_id, pending, lag_seconds)
SELECT :minute, s.id,
       (SELECT count(*) FROM (SELECT 1 FROM deliveries d
                              WHERE d.subscription_id = s.id AND d.status = 'pending'
                              LIMIT :cap)),
       (SELECT :now - min(d.run_at) FROM deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'pending' AND d.run_at <= :now)
FROM subscriptions s
WHERE s.state <> 'removed';
