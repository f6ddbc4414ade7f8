-- Read-only views of the SQLite backend (the Inspector port), with :named parameters.
-- Each runs on the reader link, outside any write transaction; the conventions
-- (REAL epoch seconds, JSON arrays, literal statuses) are those of delivery.sql.

-- name: status
-- Counted on the narrow table alone: a subscription has one event type.
SELECT s.event_type, s.name AS subscription, c.status, c.count
FROM (SELECT subscription_id, status, count(*) AS count
      FROM deliveries GROUP BY 1, 2) c
JOIN subscriptions s ON s.id = c.subscription_id
ORDER BY 1, 2, 3;

-- name: status_recent
-- As status, among the newest :window deliveries only (a backward read of the
-- primary key, however long the history): what a page that must stay fast
-- shows, the completed and cancelled counts as lower bounds once the window
-- is full.
SELECT s.event_type, s.name AS subscription, c.status, c.count
FROM (SELECT subscription_id, status, count(*) AS count
      FROM (SELECT subscription_id, status FROM deliveries ORDER BY id DESC LIMIT :window) w
      GROUP BY 1, 2) c
JOIN subscriptions s ON s.id = c.subscription_id
ORDER BY 1, 2, 3;

-- name: status_events_capped
-- The events counted no further than :window.
SELECT count(*) FROM (SELECT 1 FROM events LIMIT :window) capped;

-- name: status_oldest_pending
SELECT (julianday('now') - 2440587.5) * 86400.0 - min(run_at)
FROM deliveries
WHERE status = 'pending' AND run_at <= (julianday('now') - 2440587.5) * 86400.0;

-- name: status_events
SELECT count(*) FROM events;

-- name: status_workers
SELECT id, hostname, pid, started_at, heartbeat_at, listener_ok, listener_reconnects,
       (julianday('now') - 2440587.5) * 86400.0 - heartbeat_at AS silent_seconds, rescued
FROM workers ORDER BY started_at;

-- name: subscriptions
-- Every subscription with its backlog, each count served by a partial index
-- (deliveries_pending, deliveries_lease_until: set exactly while processing,
-- deliveries_dead), so a long completed history is never read.
SELECT s.name, s.event_type, s.state, s.ordered, s.created_at, s.worker_seen_at,
       (julianday('now') - 2440587.5) * 86400.0 - s.worker_seen_at AS silent_seconds,
       (SELECT count(*) FROM deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'pending') AS pending,
       (SELECT count(*) FROM deliveries d
        WHERE d.lease_until IS NOT NULL AND d.subscription_id = s.id
          AND d.status = 'processing') AS processing,
       (SELECT count(*) FROM deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'dead') AS dead,
       (SELECT (julianday('now') - 2440587.5) * 86400.0 - min(d.run_at) FROM deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'pending'
          AND d.run_at <= (julianday('now') - 2440587.5) * 86400.0) AS lag_seconds
FROM subscriptions s
ORDER BY s.name;

-- name: subscription_names
-- The names alone, for a filter's choices: the list above counts every dead
-- letter and pending delivery of each subscription to show them.
SELECT name FROM subscriptions ORDER BY name;

-- name: detail
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at, e.version AS event_version, e.priority,
       d.lease_until, d.worker_id, s.max_attempts
FROM deliveries d
{_delivery_joins}
WHERE d.id = :id;

-- name: history
SELECT attempt, error_type, message, traceback,
       coalesce(duration_seconds, 0.0) AS duration_seconds, worker_id, failed_at
FROM delivery_attempts WHERE delivery_id = :id ORDER BY id;

-- name: chain_root
-- The root of an event's chain: its correlation_id, or itself.
SELECT coalesce(correlation_id, id) FROM events WHERE id = :id;

-- name: chain_events
-- The root and every event correlated to it (events_correlation), oldest first.
SELECT id, event_type, key, headers, correlation_id, causation_id, created_at
FROM events WHERE id = :root
UNION ALL
SELECT id, event_type, key, headers, correlation_id, causation_id, created_at
FROM events WHERE correlation_id = :root AND correlation_id IS NOT NULL
ORDER BY id LIMIT :limit;

-- name: chain_deliveries
-- Each delivery of those events, with the handler time of its last failure.
SELECT d.event_id, d.id, s.name AS subscription, d.status, d.attempts, d.last_error, d.replays,
       d.updated_at,
       CASE WHEN d.status IN ('completed', 'dead', 'cancelled')
            THEN d.updated_at - e.created_at END AS elapsed_seconds,
       (SELECT a.duration_seconds FROM delivery_attempts a
        WHERE a.delivery_id = d.id ORDER BY a.id DESC LIMIT 1) AS last_attempt_seconds
FROM deliveries d
{_delivery_joins}
WHERE d.event_id IN (SELECT value FROM json_each(:event_ids))
ORDER BY d.event_id, s.name;

-- name: health_event_types
-- Every event type in the log, by a skip scan of the (event_type, key) index
-- (one probe per type, not a scan of the log), with a count capped at :cap.
WITH RECURSIVE types(event_type) AS (
    SELECT (SELECT event_type FROM events ORDER BY event_type LIMIT 1)
    UNION ALL
    SELECT (SELECT e.event_type FROM events e
            WHERE e.event_type > t.event_type ORDER BY e.event_type LIMIT 1)
    FROM types t WHERE t.event_type IS NOT NULL
)
SELECT t.event_type,
       (SELECT count(*) FROM (SELECT 1 FROM events e
                              WHERE e.event_type = t.event_type LIMIT :cap)) AS events,
       (SELECT count(*) FROM subscriptions s WHERE s.event_type = t.event_type) AS subscriptions
FROM types t WHERE t.event_type IS NOT NULL
ORDER BY t.event_type;

-- name: health_event_versions
-- The versions other than 1 in the log, by skip scans of the partial index
-- events_versions: the types in it (one probe each), then each type's
-- versions (one probe each), each counted up to :cap; and for each type found
-- there, its version 1 events counted up to :cap. A type absent from the
-- result has only version 1.
WITH RECURSIVE types(event_type) AS (
    SELECT (SELECT event_type FROM events WHERE version <> 1 ORDER BY event_type LIMIT 1)
    UNION ALL
    SELECT (SELECT e.event_type FROM events e
            WHERE e.version <> 1 AND e.event_type > t.event_type ORDER BY e.event_type LIMIT 1)
    FROM types t WHERE t.event_type IS NOT NULL
), found(event_type, version) AS (
    SELECT t.event_type,
           (SELECT e.version FROM events e
            WHERE e.version <> 1 AND e.event_type = t.event_type ORDER BY e.version LIMIT 1)
    FROM types t WHERE t.event_type IS NOT NULL
    UNION ALL
    SELECT f.event_type,
           (SELECT e.version FROM events e
            WHERE e.version <> 1 AND e.event_type = f.event_type AND e.version > f.version
            ORDER BY e.version LIMIT 1)
    FROM found f WHERE f.version IS NOT NULL
)
SELECT f.event_type, f.version,
       (SELECT count(*) FROM (SELECT 1 FROM events e
                              WHERE e.version <> 1 AND e.event_type = f.event_type
                                AND e.version = f.version LIMIT :cap)) AS events
FROM found f WHERE f.version IS NOT NULL
UNION ALL
SELECT t.event_type, 1,
       (SELECT count(*) FROM (SELECT 1 FROM events e
                              WHERE e.event_type = t.event_type AND e.version = 1 LIMIT :cap))
FROM types t WHERE t.event_type IS NOT NULL
ORDER BY 1, 2;

-- name: health_subscriptions
-- Per subscription, from the partial indexes only (status spelled literally so
-- the planner uses them): pending, under a lease, dead.
SELECT s.id, s.name, s.event_type, s.last_seen_at,
       (SELECT count(*) FROM deliveries d WHERE d.subscription_id = s.id
          AND d.status = 'pending' AND d.run_at <= :now) AS backlog,
       (SELECT count(*) FROM deliveries d WHERE d.subscription_id = s.id
          AND d.status = 'pending' AND d.run_at > :now) AS scheduled,
       (SELECT :now - min(d.run_at) FROM deliveries d WHERE d.subscription_id = s.id
          AND d.status = 'pending' AND d.run_at <= :now) AS lag_seconds,
       (SELECT count(*) FROM deliveries d WHERE d.lease_until IS NOT NULL
          AND d.subscription_id = s.id AND d.status = 'processing') AS in_flight,
       (SELECT count(*) FROM deliveries d WHERE d.lease_until IS NOT NULL
          AND d.lease_until < :now AND d.subscription_id = s.id
          AND d.status = 'processing') AS stuck,
       (SELECT count(*) FROM deliveries d WHERE d.subscription_id = s.id
          AND d.status = 'dead') AS dead
FROM subscriptions s
ORDER BY s.name;

-- name: health_completed_recent
-- Completions in the last hour among the newest :limit deliveries (primary
-- key order): bounded, so the answer is a lower bound when the window is full.
SELECT subscription_id,
       sum(CASE WHEN status = 'completed' AND updated_at > :now - 3600.0 THEN 1 ELSE 0 END) AS n,
       count(*) AS examined
FROM (SELECT subscription_id, status, updated_at FROM deliveries ORDER BY id DESC LIMIT :limit)
GROUP BY 1;

-- name: health_last_prune
SELECT ran_at FROM maintenance WHERE name = 'prune';

-- name: _delivery_joins
-- A delivery's (d) subscription (s) and event (e): what _delivery_filter
-- filters and _delivery_row lists. Each query names its FROM, and the index
-- it reads (INDEXED BY) where its plan depends on it.
JOIN subscriptions s ON s.id = d.subscription_id
JOIN events e ON e.id = d.event_id

-- name: _delivery_row
-- The columns of a listed delivery (DeliveryRow), over d, s and e.
d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
e.correlation_id, d.last_error, d.replays, d.run_at, d.updated_at, e.created_at,
e.version AS event_version, d.lease_until, d.worker_id, s.max_attempts

-- name: _delivery_filter
-- The conditions of a DeliveryFilter past its id bounds and status, included
-- by find_deliveries, count_deliveries and the id walks: every one optional.
-- The payload filter parses JSON only for rows the cheaper conditions kept.
-- The error and payload substrings and the error pattern are LIKE patterns
-- with a backslash escape (LIKE ignores ASCII case, as ILIKE does on PostgreSQL).
-- :condition is a state within a status: 'stuck' (processing, the lease run
-- out at :now) or 'retrying' (pending after a failure, not yet due at :now).
(:subscription IS NULL OR s.name = :subscription)
  AND (:event_type IS NULL OR e.event_type = :event_type)
  AND (:event_id IS NULL OR d.event_id = :event_id)
  AND (:key IS NULL OR e.key = :key)
  AND (:correlation_id IS NULL OR e.correlation_id = :correlation_id OR e.id = :correlation_id)
  AND (:since IS NULL OR d.updated_at >= :since)
  AND (:until IS NULL OR d.updated_at < :until)
  AND (:path IS NULL OR (CASE json_type(CAST(e.payload AS TEXT), :path)
        WHEN 'true' THEN 'true' WHEN 'false' THEN 'false'
        ELSE CAST(json_extract(CAST(e.payload AS TEXT), :path) AS TEXT) END) = :payload_value)
  AND (:error_like IS NULL OR d.last_error LIKE :error_like ESCAPE '\')
  AND (:message_like IS NULL OR d.last_error LIKE :message_like ESCAPE '\')
  AND (:payload_like IS NULL OR CAST(e.payload AS TEXT) LIKE :payload_like ESCAPE '\')
  AND (:condition IS NULL
       OR (:condition = 'stuck' AND d.status = 'processing' AND d.lease_until < :now)
       OR (:condition = 'retrying' AND d.status = 'pending' AND d.attempts > 0 AND d.run_at > :now))

-- name: find_deliveries
-- The dashboard's delivery list: every filter optional, newest first below a
-- cursor. :low_id and :high_id bound the walk (the cursor, the ids named) so
-- that it is one descending range read of the primary key, however deep the
-- page; :ids (a JSON array, or NULL) keeps only the deliveries named.
SELECT {_delivery_row}
FROM deliveries d
{_delivery_joins}
WHERE d.id BETWEEN :low_id AND :high_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND (:status IS NULL OR d.status = :status)
  AND {_delivery_filter}
ORDER BY d.id DESC
LIMIT :limit;

-- name: count_deliveries
-- As find_deliveries, counted no further than :cap rows: a capped count stays
-- fast at millions of rows and the page shows "N+".
SELECT count(*) FROM (
    SELECT 1
    FROM deliveries d
    {_delivery_joins}
    WHERE d.id BETWEEN :low_id AND :high_id
      AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
      AND (:status IS NULL OR d.status = :status)
      AND {_delivery_filter}
    LIMIT :cap
);

-- name: find_deliveries_dead
-- As find_deliveries for dead letters, the status spelled literally: the
-- planner may then read deliveries_dead_newest (the dead rows alone, already
-- newest first) instead of walking the primary key through all the others,
-- or sorting every dead letter for one page.
SELECT {_delivery_row}
FROM deliveries d INDEXED BY deliveries_dead_newest
{_delivery_joins}
WHERE d.status = 'dead'
  AND d.id BETWEEN :low_id AND :high_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND {_delivery_filter}
ORDER BY d.id DESC
LIMIT :limit;

-- name: count_deliveries_dead
-- As count_deliveries for dead letters, through deliveries_dead_newest (see find_deliveries_dead).
SELECT count(*) FROM (
    SELECT 1
    FROM deliveries d INDEXED BY deliveries_dead_newest
    {_delivery_joins}
    WHERE d.status = 'dead'
      AND d.id BETWEEN :low_id AND :high_id
      AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
      AND {_delivery_filter}
    LIMIT :cap
);

-- name: delivery_ids
-- The ids of the deliveries a filter matches above the walk's cursor, in id
-- order: one ascending range read of the primary key per batch of a bulk
-- replay, purge or cancel.
SELECT d.id
FROM deliveries d
{_delivery_joins}
WHERE d.id > :after_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND (:status IS NULL OR d.status = :status)
  AND {_delivery_filter}
ORDER BY d.id
LIMIT :limit;

-- name: delivery_ids_dead
-- As delivery_ids for dead letters, the status spelled literally and the
-- index named: the walk reads deliveries_dead_newest (the dead rows alone, in
-- id order, from the cursor on) instead of the primary key range (many rows)
-- or a join order that starts from the subscriptions.
SELECT d.id
FROM deliveries d INDEXED BY deliveries_dead_newest
{_delivery_joins}
WHERE d.status = 'dead'
  AND d.id > :after_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND {_delivery_filter}
ORDER BY d.id
LIMIT :limit;

-- name: find_deliveries_stuck
-- As find_deliveries for the condition 'stuck', written out so that the rows
-- are read through deliveries_lease_until (the few rows under a lease) instead of a walk of the
-- whole history.
SELECT {_delivery_row}
FROM deliveries d INDEXED BY deliveries_lease_until
{_delivery_joins}
WHERE d.status = 'processing' AND d.lease_until < :now
  AND d.id BETWEEN :low_id AND :high_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND {_delivery_filter}
ORDER BY d.id DESC
LIMIT :limit;

-- name: count_deliveries_stuck
-- As count_deliveries for the condition 'stuck', through deliveries_lease_until.
SELECT count(*) FROM (
    SELECT 1
    FROM deliveries d INDEXED BY deliveries_lease_until
    {_delivery_joins}
    WHERE d.status = 'processing' AND d.lease_until < :now
      AND d.id BETWEEN :low_id AND :high_id
      AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
      AND {_delivery_filter}
    LIMIT :cap
);

-- name: delivery_ids_stuck
-- As delivery_ids for the condition 'stuck', through deliveries_lease_until.
SELECT d.id
FROM deliveries d INDEXED BY deliveries_lease_until
{_delivery_joins}
WHERE d.status = 'processing' AND d.lease_until < :now
  AND d.id > :after_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND {_delivery_filter}
ORDER BY d.id
LIMIT :limit;

-- name: find_deliveries_retrying
-- As find_deliveries for the condition 'retrying', written out so that the rows
-- are read through deliveries_pending (the pending rows alone) instead of a walk of the
-- whole history.
SELECT {_delivery_row}
FROM deliveries d INDEXED BY deliveries_pending
{_delivery_joins}
WHERE d.status = 'pending' AND d.attempts > 0 AND d.run_at > :now
  AND d.id BETWEEN :low_id AND :high_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND {_delivery_filter}
ORDER BY d.id DESC
LIMIT :limit;

-- name: count_deliveries_retrying
-- As count_deliveries for the condition 'retrying', through deliveries_pending.
SELECT count(*) FROM (
    SELECT 1
    FROM deliveries d INDEXED BY deliveries_pending
    {_delivery_joins}
    WHERE d.status = 'pending' AND d.attempts > 0 AND d.run_at > :now
      AND d.id BETWEEN :low_id AND :high_id
      AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
      AND {_delivery_filter}
    LIMIT :cap
);

-- name: delivery_ids_retrying
-- As delivery_ids for the condition 'retrying', through deliveries_pending.
SELECT d.id
FROM deliveries d INDEXED BY deliveries_pending
{_delivery_joins}
WHERE d.status = 'pending' AND d.attempts > 0 AND d.run_at > :now
  AND d.id > :after_id
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND {_delivery_filter}
ORDER BY d.id
LIMIT :limit;

-- name: event_row
SELECT id, event_type, key, payload, headers, correlation_id, causation_id, created_at,
       version AS event_version, priority
FROM events WHERE id = :id;

-- name: event_deliveries
-- Every delivery of one event (the unique (event_id, subscription_id) index finds them).
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at, e.version AS event_version, e.priority,
       d.lease_until, d.worker_id, s.max_attempts
FROM deliveries d
{_delivery_joins}
WHERE d.event_id = :id
ORDER BY s.name;

-- name: event_history
-- The failed attempts of every delivery of one event, oldest first.
SELECT a.delivery_id, a.attempt, a.error_type, a.message, a.traceback,
       coalesce(a.duration_seconds, 0.0) AS duration_seconds, a.worker_id, a.failed_at
FROM delivery_attempts a
JOIN deliveries d ON d.id = a.delivery_id
WHERE d.event_id = :id
ORDER BY a.id;

-- name: rollup_counts
-- The throughput rollup from the minute :since (epoch seconds) on, summed per
-- subscription and step of :step seconds (every worker's rows of a minute add
-- up; the largest queue sample of a step stands for it); :subscription: one
-- subscription's rows alone (NULL: all). One range read of
-- throughput_rollup_minute: the deliveries are never read.
SELECT s.name AS subscription, (r.minute / :step) * :step AS start,
       sum(r.completed) AS completed, sum(r.failed) AS failed, sum(r.dead) AS dead,
       max(r.pending) AS pending, max(r.lag_seconds) AS lag_seconds
FROM throughput_rollup r
JOIN subscriptions s ON s.id = r.subscription_id
WHERE r.minute >= :since AND (:subscription IS NULL OR s.name = :subscription)
GROUP BY 1, 2
ORDER BY 2, 1;

-- name: rollup_durations
-- The duration histograms of the same rows, merged per subscription, step
-- and bucket (a histogram is summed bucket by bucket).
SELECT s.name AS subscription, (r.minute / :step) * :step AS start,
       CAST(d.key AS INTEGER) AS bucket, sum(d.value) AS runs
FROM throughput_rollup r
JOIN subscriptions s ON s.id = r.subscription_id
JOIN json_each(r.durations) d
WHERE r.minute >= :since AND r.durations IS NOT NULL
  AND (:subscription IS NULL OR s.name = :subscription)
GROUP BY 1, 2, 3;

