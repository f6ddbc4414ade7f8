-- Read-only views of the PostgreSQL backend (PgInspector): status, deliveries,
-- events, chains, health. {schema} is the validated, quoted schema.

-- name: status
-- Counted on the narrow table alone: a subscription has one event type, so
-- the wide events table is not joined.
SELECT s.event_type, s.name AS subscription, c.status, c.count
FROM (SELECT subscription_id, status, count(*) AS count
      FROM {schema}.deliveries GROUP BY 1, 2) c
JOIN {schema}.subscriptions s ON s.id = c.subscription_id
ORDER BY 1, 2, 3;

-- name: status_recent
-- As status, among the newest $1 deliveries only (a backward read of the
-- primary key, however long the history): what a page that must stay fast
-- shows, the completed and cancelled counts as lower bounds once the window
-- is full.
SELECT s.event_type, s.name AS subscription, c.status, c.count
FROM (SELECT subscription_id, status, count(*) AS count
      FROM (SELECT subscription_id, status FROM {schema}.deliveries ORDER BY id DESC LIMIT $1) w
      GROUP BY 1, 2) c
JOIN {schema}.subscriptions s ON s.id = c.subscription_id
ORDER BY 1, 2, 3;

-- name: status_events_capped
-- The events counted no further than $1.
SELECT count(*) FROM (SELECT 1 FROM {schema}.events LIMIT $1) capped;

-- name: _oldest_due
-- The earliest run_at of subscription s's due pending rows: the lesser of the
-- first place of a due row in deliveries_claim_order (a row's place is its
-- run_at when it waits 0, later otherwise) and the earliest due row with a
-- wait (deliveries_pending_prioritised); see next_run_in. The "due" test is on
-- the index entries' run_at.
least(
    (SELECT {schema}.claim_place(d.run_at, d.priority_wait) FROM {schema}.deliveries d
     WHERE d.subscription_id = s.id AND d.status = 'pending' AND d.run_at <= now()
     ORDER BY {schema}.claim_place(d.run_at, d.priority_wait), d.run_at, d.id
     LIMIT 1),
    (SELECT d.run_at FROM {schema}.deliveries d
     WHERE d.subscription_id = s.id AND d.status = 'pending' AND d.priority_wait > 0
       AND d.run_at <= now()
     ORDER BY d.run_at
     LIMIT 1))

-- name: status_oldest_pending
-- Per subscription (two index probes each), then the oldest of them.
SELECT extract(epoch FROM now() - min({_oldest_due}))::float8
FROM {schema}.subscriptions s;

-- name: status_events
SELECT count(*) FROM {schema}.events;

-- name: status_workers
SELECT id::text, hostname, pid, started_at, heartbeat_at, listener_ok, listener_reconnects,
       extract(epoch FROM now() - heartbeat_at)::float8 AS silent_seconds, rescued
FROM {schema}.workers ORDER BY started_at;

-- name: subscriptions
-- Every subscription with its backlog, each count served by a partial index
-- (deliveries_claim_order, deliveries_lease_until: set exactly while
-- processing, deliveries_dead), so a long completed history is never read.
SELECT s.name, s.event_type, s.state, s.ordered, s.created_at, s.worker_seen_at,
       extract(epoch FROM now() - s.worker_seen_at)::float8 AS silent_seconds,
       (SELECT count(*) FROM {schema}.deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'pending') AS pending,
       (SELECT count(*) FROM {schema}.deliveries d
        WHERE d.lease_until IS NOT NULL AND d.subscription_id = s.id
          AND d.status = 'processing') AS processing,
       (SELECT count(*) FROM {schema}.deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'dead') AS dead,
       extract(epoch FROM now() - {_oldest_due})::float8 AS lag_seconds
FROM {schema}.subscriptions s
ORDER BY s.name;

-- name: subscription_names
-- The names alone, for a filter's choices: the list above counts every dead
-- letter and pending delivery of each subscription to show them.
SELECT name FROM {schema}.subscriptions ORDER BY name;

-- name: detail
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers::text AS headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at, e.version AS event_version, e.priority,
       d.lease_until, d.worker_id::text AS worker_id, s.max_attempts
FROM {_delivery_from}
WHERE d.id = $1;

-- name: history
SELECT attempt, error_type, message, traceback, coalesce(duration_seconds, 0) AS duration_seconds,
       worker_id::text, failed_at
FROM {schema}.delivery_attempts WHERE delivery_id = $1 ORDER BY id;

-- name: chain_root
-- The root of an event's chain: its correlation_id, or itself.
SELECT coalesce(correlation_id, id) FROM {schema}.events WHERE id = $1;

-- name: chain_events
-- The root and every event correlated to it (events_correlation), oldest first.
SELECT id, event_type, key, headers::text AS headers, correlation_id, causation_id, created_at
FROM {schema}.events WHERE id = $1 OR correlation_id = $1
ORDER BY id LIMIT $2;

-- name: chain_deliveries
-- Each delivery of those events, with the handler time of its last failure.
SELECT d.event_id, d.id, s.name AS subscription, d.status, d.attempts, d.last_error, d.replays,
       d.updated_at,
       CASE WHEN d.status IN ('completed', 'dead', 'cancelled')
            THEN extract(epoch FROM d.updated_at - e.created_at)::float8 END AS elapsed_seconds,
       (SELECT a.duration_seconds FROM {schema}.delivery_attempts a
        WHERE a.delivery_id = d.id ORDER BY a.id DESC LIMIT 1) AS last_attempt_seconds
FROM {_delivery_from}
WHERE d.event_id = ANY($1::bigint[])
ORDER BY d.event_id, s.name;

-- name: health_event_types
-- Every event type in the log, found by a skip scan of the (event_type, key)
-- index (one probe per type, not a scan of the log), with a count capped at $1.
WITH RECURSIVE types AS (
    (SELECT event_type FROM {schema}.events ORDER BY event_type LIMIT 1)
    UNION ALL
    SELECT (SELECT e.event_type FROM {schema}.events e
            WHERE e.event_type > t.event_type ORDER BY e.event_type LIMIT 1)
    FROM types t WHERE t.event_type IS NOT NULL
)
SELECT t.event_type,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e
                              WHERE e.event_type = t.event_type LIMIT $1) c) AS events,
       (SELECT count(*) FROM {schema}.subscriptions s WHERE s.event_type = t.event_type)
           AS subscriptions
FROM types t WHERE t.event_type IS NOT NULL
ORDER BY t.event_type;

-- name: health_event_versions
-- The versions other than 1 in the log, by a skip scan of the partial index
-- events_versions (one probe per (type, version)), each counted up to $1; and
-- for each type found there, its version 1 events counted up to $1 through the
-- (event_type, key) index (the count stops at the cap; few version 1 rows
-- among many newer ones are looked for among the type's rows). A type absent
-- from the result has only version 1.
WITH RECURSIVE found AS (
    (SELECT event_type, version FROM {schema}.events WHERE version <> 1
     ORDER BY event_type, version LIMIT 1)
    UNION ALL
    SELECT n.event_type, n.version
    FROM found f CROSS JOIN LATERAL (
        SELECT e.event_type, e.version FROM {schema}.events e
        WHERE e.version <> 1 AND (e.event_type, e.version) > (f.event_type, f.version)
        ORDER BY e.event_type, e.version LIMIT 1) n
)
SELECT f.event_type, f.version,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e
                              WHERE e.version <> 1 AND e.event_type = f.event_type
                                AND e.version = f.version LIMIT $1) c) AS events
FROM found f
UNION ALL
SELECT t.event_type, 1,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e
                              WHERE e.event_type = t.event_type AND e.version = 1 LIMIT $1) c)
FROM (SELECT DISTINCT event_type FROM found) t
ORDER BY 1, 2;

-- name: health_subscriptions
-- Per subscription, from the partial indexes only: pending rows
-- (deliveries_claim_order, which holds run_at), rows under a lease
-- (deliveries_lease_until), dead rows (deliveries_dead).
SELECT s.id, s.name, s.event_type, s.last_seen_at,
       p.backlog, p.scheduled, p.lag_seconds,
       coalesce(l.in_flight, 0) AS in_flight, coalesce(l.stuck, 0) AS stuck,
       (SELECT count(*) FROM {schema}.deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'dead') AS dead
FROM {schema}.subscriptions s
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE d.run_at <= now()) AS backlog,
           count(*) FILTER (WHERE d.run_at > now()) AS scheduled,
           extract(epoch FROM now() - min(d.run_at) FILTER (WHERE d.run_at <= now()))::float8
               AS lag_seconds
    FROM {schema}.deliveries d WHERE d.subscription_id = s.id AND d.status = 'pending') p
LEFT JOIN (
    SELECT subscription_id, count(*) AS in_flight,
           count(*) FILTER (WHERE lease_until < now()) AS stuck
    FROM {schema}.deliveries
    WHERE lease_until IS NOT NULL AND status = 'processing'
    GROUP BY 1) l ON l.subscription_id = s.id
ORDER BY s.name;

-- name: health_completed_recent
-- Completions in the last hour among the newest $1 deliveries (primary key
-- order): bounded, so the answer is a lower bound when the window is full.
SELECT subscription_id,
       count(*) FILTER (WHERE status = 'completed' AND updated_at > now() - interval '1 hour') AS n,
       count(*) AS examined
FROM (SELECT subscription_id, status, updated_at FROM {schema}.deliveries
      ORDER BY id DESC LIMIT $1) recent
GROUP BY 1;

-- name: health_tables
-- Size and dead tuples of the bus's tables: what decides whether a queue
-- table degrades (dead index entries walked by every claim). The chunks of
-- the event log are summed into their table (events); a chunk the pruner
-- drops meanwhile has no size any more and is left out.
SELECT r.relname AS table, sum(t.n_live_tup)::bigint AS live_tuples,
       sum(t.n_dead_tup)::bigint AS dead_tuples,
       sum(pg_total_relation_size(t.relid))::bigint AS total_bytes,
       max(t.last_autovacuum) AS last_autovacuum
FROM pg_stat_user_tables t
JOIN pg_class r ON r.oid = coalesce(pg_partition_root(t.relid), t.relid)
WHERE t.schemaname = $1 AND pg_total_relation_size(t.relid) IS NOT NULL
GROUP BY r.relname
ORDER BY r.relname;

-- name: health_horizon
-- The oldest other transaction holding a snapshot or an xid: while it runs,
-- VACUUM cannot remove any row version deleted after it started.
SELECT pid, state, extract(epoch FROM now() - xact_start)::float8 AS age_seconds,
       application_name
FROM pg_stat_activity
WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
ORDER BY xact_start
LIMIT 1;

-- name: health_last_prune
SELECT ran_at FROM {schema}.maintenance WHERE name = 'prune';

-- name: inspect_timeout
-- Dashboard reads run in a read-only transaction with their own statement
-- timeout, so a heavy filter can never hold a connection for long.
SET LOCAL statement_timeout = '5s';

-- name: inspect_custom_plans
-- ... and they are planned for the values given each time. The filter's
-- conditions are all optional; a generic plan (what a pooled connection
-- settles on after five runs) cannot drop those left NULL, misjudges them all
-- and joins the whole events table first: 3.4 s for the newest page of
-- 1,000,000 deliveries, against 0.1 ms planned for the values.
SET LOCAL plan_cache_mode = force_custom_plan;

-- name: _delivery_from
-- A delivery (d) with its subscription (s) and its event (e): what
-- _delivery_filter filters and _delivery_row lists.
{schema}.deliveries d
JOIN {schema}.subscriptions s ON s.id = d.subscription_id
JOIN {schema}.events e ON e.id = d.event_id

-- name: _delivery_row
-- The columns of a listed delivery (DeliveryRow), over _delivery_from.
d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
e.correlation_id, d.last_error, d.replays, d.run_at, d.updated_at, e.created_at,
e.version AS event_version, d.lease_until, d.worker_id::text AS worker_id, s.max_attempts

-- name: _delivery_filter
-- The conditions of a DeliveryFilter, included by find_deliveries,
-- count_deliveries and the id walks ($1 subscription, $2 status, $3 event
-- type, $4 event id, $5 key, $6 correlation id, $7/$8 updated since/until,
-- $9/$10 payload path and value, $11 ids, $12 error substring and $13 error
-- pattern as LIKE patterns, $14 payload substring as one): every one
-- optional. $2 is a status, or a condition within one: 'stuck' (processing,
-- the lease run out) or 'retrying' (pending after a failure, not yet due).
-- The payload filters decode the payload only for rows the cheaper
-- conditions kept; ILIKE, as SQLite's LIKE, ignores case. lease_until is set
-- exactly while a delivery is processing: said for status 'processing', it
-- lets the lease index (deliveries_lease_until) find those rows alone. A status
-- of 'dead', 'pending' or 'cancelled' has its own partial index. A
-- subscription has one event type, its events' (register never changes it):
-- the type is read on the subscription, so a list by type walks its
-- subscriptions' deliveries instead of hashing every event of the type, and a
-- key is looked up by (event type, key) in events_type_key, once per
-- subscription, instead of scanning the log.
($1::text IS NULL OR s.name = $1)
  AND ($2::text IS NULL OR d.status = $2
       OR ($2 = 'stuck' AND d.status = 'processing' AND d.lease_until < now())
       OR ($2 = 'retrying' AND d.status = 'pending' AND d.attempts > 0 AND d.run_at > now()))
  AND ($2::text IS DISTINCT FROM 'processing' OR d.lease_until IS NOT NULL)
  AND ($3::text IS NULL OR s.event_type = $3)
  AND ($4::bigint IS NULL OR d.event_id = $4)
  AND ($5::text IS NULL OR (e.key = $5 AND e.event_type = s.event_type))
  AND ($6::bigint IS NULL OR e.correlation_id = $6 OR e.id = $6)
  AND ($7::timestamptz IS NULL OR d.updated_at >= $7)
  AND ($8::timestamptz IS NULL OR d.updated_at < $8)
  AND ($9::text[] IS NULL OR convert_from(e.payload, 'UTF8')::jsonb #>> $9 = $10)
  AND ($11::bigint[] IS NULL OR d.id = ANY($11))
  AND ($12::text IS NULL OR d.last_error ILIKE $12)
  AND ($13::text IS NULL OR d.last_error ILIKE $13)
  AND ($14::text IS NULL OR convert_from(e.payload, 'UTF8') ILIKE $14)

-- name: find_deliveries
-- The dashboard's delivery list: every filter optional, newest first below a
-- cursor id (one descending walk of the primary key, however deep the page).
SELECT {_delivery_row}
FROM {_delivery_from}
WHERE {_delivery_filter}
  AND ($15::bigint IS NULL OR d.id < $15)
ORDER BY d.id DESC
LIMIT $16;

-- name: count_deliveries
-- As find_deliveries, counted no further than $15 rows: a capped count stays
-- fast at millions of rows and the page shows "N+".
SELECT count(*) FROM (
    SELECT 1
    FROM {_delivery_from}
    WHERE {_delivery_filter}
    LIMIT $15
) capped;

-- name: find_deliveries_dead
-- As find_deliveries for $2 = 'dead', with the status also written out: only
-- then can a generic plan (what a pooled connection settles on) read the
-- dead-letter partial index deliveries_dead_newest, the dead rows alone and
-- newest first, instead of walking the whole history around them (or sorting
-- every dead letter, through deliveries_dead).
SELECT {_delivery_row}
FROM {_delivery_from}
WHERE d.status = 'dead'
  AND {_delivery_filter}
  AND ($15::bigint IS NULL OR d.id < $15)
ORDER BY d.id DESC
LIMIT $16;

-- name: count_deliveries_dead
-- As count_deliveries for $2 = 'dead', through deliveries_dead (see find_deliveries_dead).
SELECT count(*) FROM (
    SELECT 1
    FROM {_delivery_from}
    WHERE d.status = 'dead'
      AND {_delivery_filter}
    LIMIT $15
) capped;

-- name: delivery_ids
-- The walk of a bulk replay, purge or cancel: the ids matching the filters of
-- find_deliveries above the cursor $15, in id order (one ascending range read
-- of the primary key per batch, from where the previous batch stopped).
SELECT d.id
FROM {_delivery_from}
WHERE {_delivery_filter}
  AND d.id > $15
ORDER BY d.id
LIMIT $16;

-- name: delivery_ids_dead
-- As delivery_ids for $2 = 'dead', with the status also written out: only
-- then can the dead-letter partial index (deliveries_dead) serve the walk, so
-- that it reads the dead rows alone however long the history around them is.
SELECT d.id
FROM {_delivery_from}
WHERE d.status = 'dead'
  AND {_delivery_filter}
  AND d.id > $15
ORDER BY d.id
LIMIT $16;

-- name: find_deliveries_stuck
-- As find_deliveries for the condition 'stuck' ($2), the conditions written out, so the
-- rows are found through deliveries_lease_until (the few rows under a lease)
-- instead of a walk of the whole history.
SELECT {_delivery_row}
FROM {_delivery_from}
WHERE d.status = 'processing' AND d.lease_until < now()
  AND {_delivery_filter}
  AND ($15::bigint IS NULL OR d.id < $15)
ORDER BY d.id DESC
LIMIT $16;

-- name: count_deliveries_stuck
-- As count_deliveries for the condition 'stuck' (see find_deliveries_stuck).
SELECT count(*) FROM (
    SELECT 1
    FROM {_delivery_from}
    WHERE d.status = 'processing' AND d.lease_until < now()
      AND {_delivery_filter}
    LIMIT $15
) capped;

-- name: delivery_ids_stuck
-- As delivery_ids for the condition 'stuck' (see find_deliveries_stuck).
SELECT d.id
FROM {_delivery_from}
WHERE d.status = 'processing' AND d.lease_until < now()
  AND {_delivery_filter}
  AND d.id > $15
ORDER BY d.id
LIMIT $16;

-- name: find_deliveries_retrying
-- As find_deliveries for the condition 'retrying' ($2), the conditions written out, so the
-- rows are found among the pending ones (deliveries_claim_order) instead of a
-- walk of the whole history.
SELECT {_delivery_row}
FROM {_delivery_from}
WHERE d.status = 'pending' AND d.attempts > 0 AND d.run_at > now()
  AND {_delivery_filter}
  AND ($15::bigint IS NULL OR d.id < $15)
ORDER BY d.id DESC
LIMIT $16;

-- name: count_deliveries_retrying
-- As count_deliveries for the condition 'retrying' (see find_deliveries_retrying).
SELECT count(*) FROM (
    SELECT 1
    FROM {_delivery_from}
    WHERE d.status = 'pending' AND d.attempts > 0 AND d.run_at > now()
      AND {_delivery_filter}
    LIMIT $15
) capped;

-- name: delivery_ids_retrying
-- As delivery_ids for the condition 'retrying' (see find_deliveries_retrying).
SELECT d.id
FROM {_delivery_from}
WHERE d.status = 'pending' AND d.attempts > 0 AND d.run_at > now()
  AND {_delivery_filter}
  AND d.id > $15
ORDER BY d.id
LIMIT $16;

-- name: event_row
SELECT id, event_type, key, payload, headers::text AS headers, correlation_id, causation_id, created_at,
       version AS event_version, priority
FROM {schema}.events WHERE id = $1;

-- name: event_deliveries
-- Every delivery of one event (the unique (event_id, subscription_id) index finds them).
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers::text AS headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at, e.version AS event_version, e.priority,
       d.lease_until, d.worker_id::text AS worker_id, s.max_attempts
FROM {_delivery_from}
WHERE d.event_id = $1
ORDER BY s.name;

-- name: event_history
-- The failed attempts of every delivery of one event, oldest first.
SELECT a.delivery_id, a.attempt, a.error_type, a.message, a.traceback,
       coalesce(a.duration_seconds, 0) AS duration_seconds, a.worker_id::text, a.failed_at
FROM {schema}.delivery_attempts a
JOIN {schema}.deliveries d ON d.id = a.delivery_id
WHERE d.event_id = $1
ORDER BY a.id;

-- name: replica_lag
-- Seconds the answering server is behind its primary: 0 when it has replayed
-- everything it received (an idle primary sends nothing to be behind on), the
-- age of the last replayed commit otherwise; NULL on a primary.
SELECT CASE
    WHEN NOT pg_is_in_recovery() THEN NULL
    WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0.0
    ELSE greatest(0.0, extract(epoch FROM now() - pg_last_xact_replay_timestamp()))::float8
END;

-- name: rollup_settings
-- For the rollup's reads, in their transaction: the planner cannot tell how
-- few buckets a histogram holds (it takes a hundred per row), so it would
-- compile the day's read (JIT: most of a second), start a parallel worker and
-- sort the buckets on disk, each costing more than the read itself. The
-- memory is for the day's merge of the histograms, hashed in one pass.
SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true),
       set_config('work_mem', '64MB', true);

-- name: rollup_counts
-- The throughput rollup from the minute $1 (epoch seconds) on, summed per
-- subscription and step of $2 seconds (every worker's rows of a minute add
-- up; the largest queue sample of a step stands for it); $3: one
-- subscription's rows alone (NULL: all). One range read of
-- throughput_rollup_minute: the deliveries are never read.
SELECT s.name AS subscription,
       (floor(extract(epoch FROM r.minute) / $2::float8) * $2::float8)::bigint AS start,
       sum(r.completed)::bigint AS completed, sum(r.failed)::bigint AS failed,
       sum(r.dead)::bigint AS dead, max(r.pending) AS pending, max(r.lag_seconds) AS lag_seconds
FROM {schema}.throughput_rollup r
JOIN {schema}.subscriptions s ON s.id = r.subscription_id
WHERE r.minute >= to_timestamp($1::float8) AND ($3::text IS NULL OR s.name = $3::text)
GROUP BY 1, 2
ORDER BY 2, 1;

-- name: rollup_durations
-- The duration histograms of the same rows, merged per subscription, step
-- and bucket (a histogram is summed bucket by bucket).
SELECT s.name AS subscription,
       (floor(extract(epoch FROM r.minute) / $2::float8) * $2::float8)::bigint AS start,
       d.key::int AS bucket, sum(d.value::bigint)::bigint AS runs
FROM {schema}.throughput_rollup r
JOIN {schema}.subscriptions s ON s.id = r.subscription_id
CROSS JOIN LATERAL jsonb_each(r.durations) d
WHERE r.minute >= to_timestamp($1::float8) AND r.durations IS NOT NULL
  AND ($3::text IS NULL OR s.name = $3::text)
GROUP BY 1, 2, 3;

