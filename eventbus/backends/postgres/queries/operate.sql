-- Guarded admin writes of the PostgreSQL backend (PgOperator). {schema} is the
-- validated, quoted schema. Every status change is one statement guarded by the
-- expected status.

-- name: subscription_state
-- Guarded: moves the named subscription only from one of the states $3.
UPDATE {schema}.subscriptions SET state = $2
WHERE name = $1 AND state = ANY($3::text[])
RETURNING id, event_type;

-- name: subscription_exists
SELECT id FROM {schema}.subscriptions WHERE name = $1;

-- name: cancel_subscription
-- The pending deliveries of a removed subscription end cancelled.
UPDATE {schema}.deliveries SET status = 'cancelled', updated_at = now()
WHERE subscription_id = $1 AND status = 'pending';

-- name: replay
-- Guarded dead -> pending, attempts reset, replay count and time kept. A
-- removed subscription's dead rows stay dead: no worker would take them.
UPDATE {schema}.deliveries d
SET status = 'pending', attempts = 0, run_at = now(), replays = d.replays + 1,
    replayed_at = now(), lease_until = NULL, lease_token = NULL, updated_at = now()
WHERE d.id = ANY($1::bigint[]) AND d.status = 'dead'
  AND d.subscription_id NOT IN (SELECT id FROM {schema}.subscriptions WHERE state = 'removed')
RETURNING d.subscription_id;

-- name: purge
WITH gone AS (
    DELETE FROM {schema}.deliveries WHERE id = ANY($1::bigint[]) AND status = 'dead'
    RETURNING id
), history AS (
    DELETE FROM {schema}.delivery_attempts a USING gone WHERE a.delivery_id = gone.id
)
SELECT count(*) FROM gone;

-- name: cancel
UPDATE {schema}.deliveries SET status = 'cancelled', updated_at = now()
WHERE id = ANY($1::bigint[]) AND status = 'pending'
RETURNING id;

-- name: retry_now
-- Guarded: a pending delivery waiting for its run_at (a retry's backoff, or a
-- delay) becomes due now, and the workers of its subscription are woken as by
-- a publish. Its place in the claim order is an expression over run_at
-- (claim_place), so it moves with it: a low priority still waits its priority's
-- wait behind rows due as long, as after any retry. A due row is left alone.
WITH moved AS (
    UPDATE {schema}.deliveries SET run_at = now(), updated_at = now()
    WHERE id = ANY($1::bigint[]) AND status = 'pending' AND run_at > now()
    RETURNING subscription_id
), notified AS (
    SELECT pg_notify($2, s.event_type) FROM {schema}.subscriptions s
    WHERE s.id IN (SELECT subscription_id FROM moved)
)
SELECT (SELECT count(*) FROM moved) AS moved, (SELECT count(*) FROM notified) AS notified;

-- name: release_stuck
-- An operator's release of stuck deliveries: processing rows whose lease ran
-- out (by the database's clock), or whose worker is lost (no heartbeat for $3
-- seconds, or no row any more); $2 is the wake-up channel, $4 the message kept. Moved as a lease recovery moves them: the
-- attempt counts; back to pending, or dead when out of attempts; run_at kept
-- (it was due when claimed), so a delivery keeps its place. The lease token is
-- cleared: a worker that still finishes the run is refused by the token guard.
-- The whole condition sits in the UPDATE's WHERE, so a concurrent renewal or
-- completion is seen when the row is locked and re-checked.
WITH released AS (
    UPDATE {schema}.deliveries d
    SET status = CASE WHEN d.attempts >= s.max_attempts THEN 'dead' ELSE 'pending' END,
        last_error = 'Released: ' || $4, lease_until = NULL, lease_token = NULL, updated_at = now()
    FROM {schema}.subscriptions s
    WHERE d.id = ANY($1::bigint[]) AND s.id = d.subscription_id AND d.status = 'processing'
      AND (d.lease_until < now() OR NOT EXISTS (
            SELECT 1 FROM {schema}.workers w
            WHERE w.id = d.worker_id AND w.heartbeat_at >= now() - $3 * interval '1 second'))
    RETURNING d.id, d.attempts, d.worker_id, d.subscription_id, d.status
), history AS (
    INSERT INTO {schema}.delivery_attempts (delivery_id, attempt, error_type, message, worker_id)
    SELECT id, attempts, 'Released', $4, worker_id FROM released
), notified AS (
    SELECT pg_notify($2, s.event_type) FROM {schema}.subscriptions s
    WHERE s.id IN (SELECT subscription_id FROM released WHERE status = 'pending')
)
SELECT (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM notified) AS notified;

-- name: cancel_stuck
-- As cancel, and processing rows that are stuck too (the condition of
-- release_stuck, $2 seconds of silence): the lease token is cleared, so the
-- worker that may still finish the run is refused by the token guard.
UPDATE {schema}.deliveries d
SET status = 'cancelled', lease_until = NULL, lease_token = NULL, updated_at = now()
WHERE d.id = ANY($1::bigint[])
  AND (d.status = 'pending' OR (d.status = 'processing' AND (d.lease_until < now() OR NOT EXISTS (
        SELECT 1 FROM {schema}.workers w
        WHERE w.id = d.worker_id AND w.heartbeat_at >= now() - $2 * interval '1 second'))))
RETURNING d.id;

-- name: notify_subscriptions
SELECT pg_notify($1, event_type) FROM {schema}.subscriptions WHERE id = ANY($2::int[]);


-- name: audit_record
-- One operator action in the audit trail; the time is the database's.
INSERT INTO {schema}.audit_log (actor, origin, action, target, filter, count, interface)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id;

-- name: audit_page
-- The audit trail newest first below the keyset cursor $1 (an id), $2 rows:
-- a backward range read of the primary key.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM {schema}.audit_log
WHERE id < $1
ORDER BY id DESC
LIMIT $2;

-- name: audit_page_action
-- One action's rows ($3) newest first below the cursor $1, $2 rows: a
-- backward range read of audit_log_action. The filter is written `= ANY` of a
-- one-element array, which matches the same rows as `=` but leaves the action
-- in the ORDER BY: with a plain `=` the planner drops that sort key as
-- constant, and when it guesses many matching rows it walks the primary key
-- backwards and filters instead, reading the whole table when none match.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM {schema}.audit_log
WHERE action = ANY (ARRAY[$3::text]) AND id < $1
ORDER BY action DESC, id DESC
LIMIT $2;

-- name: audit_page_actor_action
-- One actor's ($4) rows of one action ($3) newest first below the cursor $1,
-- $2 rows: a backward range read of audit_log_actor_action (`= ANY` keeps the
-- leading sort key, see audit_page_action).
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM {schema}.audit_log
WHERE actor = ANY (ARRAY[$4::text]) AND action = $3 AND id < $1
ORDER BY actor DESC, action DESC, id DESC
LIMIT $2;

-- name: audit_page_actor
-- One actor's rows ($3) newest first below the cursor $1, $2 rows: a
-- backward range read of audit_log_actor (`= ANY` keeps the leading sort key,
-- see audit_page_action).
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM {schema}.audit_log
WHERE actor = ANY (ARRAY[$3::text]) AND id < $1
ORDER BY actor DESC, id DESC
LIMIT $2;
