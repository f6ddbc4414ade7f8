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
