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
-- backward range read of audit_log_action.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM {schema}.audit_log
WHERE action = $3 AND id < $1
ORDER BY action DESC, id DESC
LIMIT $2;

-- name: audit_page_actor_action
-- One actor's ($4) rows of one action ($3) newest first below the cursor $1,
-- $2 rows: a backward range read of audit_log_actor_action.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM {schema}.audit_log
WHERE actor = $4 AND action = $3 AND id < $1
ORDER BY actor DESC, action DESC, id DESC
LIMIT $2;

-- name: audit_page_actor
-- One actor's rows ($3) newest first below the cursor $1, $2 rows: a
-- backward range read of audit_log_actor.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM {schema}.audit_log
WHERE actor = $3 AND id < $1
ORDER BY actor DESC, id DESC
LIMIT $2;
