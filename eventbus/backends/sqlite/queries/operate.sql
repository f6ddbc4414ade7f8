-- Guarded admin writes of the SQLite backend (the Operator port): each moves only
-- rows still in the expected state. Conventions as in delivery.sql.

-- name: subscription_state
-- Guarded: moves the named subscription only from one of the states :from_states.
UPDATE subscriptions SET state = :state
WHERE name = :name AND state IN (SELECT value FROM json_each(:from_states))
RETURNING id, event_type;

-- name: subscription_exists
SELECT id FROM subscriptions WHERE name = :name;

-- name: cancel_subscription
-- The pending deliveries of a removed subscription end cancelled.
UPDATE deliveries SET status = 'cancelled', updated_at = :now
WHERE subscription_id = :subscription_id AND status = 'pending';

-- name: replay
-- Guarded dead -> pending, attempts reset, replay count and time kept. A
-- removed subscription's dead rows stay dead: no worker would take them.
UPDATE deliveries
SET status = 'pending', attempts = 0, run_at = :now, replays = replays + 1,
    replayed_at = :now, lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'dead'
  AND subscription_id NOT IN (SELECT id FROM subscriptions WHERE state = 'removed')
RETURNING subscription_id;

-- name: purge
DELETE FROM deliveries WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'dead'
RETURNING id;

-- name: purge_history
DELETE FROM delivery_attempts WHERE delivery_id IN (SELECT value FROM json_each(:ids));

-- name: cancel
UPDATE deliveries SET status = 'cancelled', updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'pending'
RETURNING id;


-- name: retry_now
-- Guarded: a pending delivery waiting for its run_at (a retry's backoff, or a
-- delay) becomes due now. Its place in the claim order is run_at plus its
-- priority's wait, so it moves with run_at and priorities keep their meaning.
UPDATE deliveries SET run_at = :now, updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'pending' AND run_at > :now
RETURNING subscription_id;

-- name: release_stuck
-- An operator's release of stuck deliveries: processing rows whose lease ran
-- out, or whose worker is lost (no heartbeat for :lost_after seconds, or no
-- row any more). Moved as recover_expired moves them: the attempt counts; back
-- to pending, or dead when out of attempts; run_at kept. The lease token is
-- cleared, so a worker that still finishes the run is refused by its guard.
UPDATE deliveries
SET status = CASE WHEN attempts >= (SELECT s.max_attempts FROM subscriptions s
                                    WHERE s.id = deliveries.subscription_id)
                  THEN 'dead' ELSE 'pending' END,
    last_error = 'Released: ' || :message,
    lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'processing'
  AND (lease_until < :now OR NOT EXISTS (
        SELECT 1 FROM workers w
        WHERE w.id = deliveries.worker_id AND w.heartbeat_at >= :now - :lost_after))
RETURNING id, attempts, worker_id, subscription_id, status;

-- name: release_record
INSERT INTO delivery_attempts (delivery_id, attempt, error_type, message, worker_id, failed_at)
VALUES (:delivery_id, :attempt, 'Released', :message, :worker_id, :now);

-- name: cancel_stuck
-- As cancel, and processing rows that are stuck too (the condition of
-- release_stuck): the lease token is cleared, so the worker that may still
-- finish the run is refused by its guard.
UPDATE deliveries
SET status = 'cancelled', lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids))
  AND (status = 'pending' OR (status = 'processing' AND (lease_until < :now OR NOT EXISTS (
        SELECT 1 FROM workers w
        WHERE w.id = deliveries.worker_id AND w.heartbeat_at >= :now - :lost_after))))
RETURNING id;

-- name: audit_record
-- One operator action in the audit trail; :now is the writer's clock.
INSERT INTO audit_log (at, actor, origin, action, target, filter, count, interface)
VALUES (:now, :actor, :origin, :action, :target, :filter, :count, :interface)
RETURNING id;

-- name: audit_page
-- The audit trail newest first below the keyset cursor :before (an id),
-- :limit rows: a backward range read of the primary key.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM audit_log
WHERE id < :before
ORDER BY id DESC
LIMIT :limit;

-- name: audit_page_action
-- One action's rows newest first below the cursor: a backward range read of
-- audit_log_action.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM audit_log INDEXED BY audit_log_action
WHERE action = :action AND id < :before
ORDER BY id DESC
LIMIT :limit;

-- name: audit_page_actor_action
-- One actor's rows of one action newest first below the cursor: a backward
-- range read of audit_log_actor_action.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM audit_log INDEXED BY audit_log_actor_action
WHERE actor = :actor AND action = :action AND id < :before
ORDER BY id DESC
LIMIT :limit;

-- name: audit_page_actor
-- One actor's rows newest first below the cursor: a backward range read of
-- audit_log_actor.
SELECT id, at, actor, origin, action, target, filter, count, interface
FROM audit_log INDEXED BY audit_log_actor
WHERE actor = :actor AND id < :before
ORDER BY id DESC
LIMIT :limit;
