-- Queries of the SQLite backend, with :named parameters.
-- Every write runs inside one BEGIN IMMEDIATE transaction on the process's
-- writer connection; :now is the database clock read once at its start
-- (REAL epoch seconds), so one transaction sees one time, as now() does in
-- PostgreSQL. Arrays travel as JSON text and are opened with json_each.
-- {priority_step} is the seconds a priority level is worth (the bus's
-- priority_step_seconds) and {max_priority_wait} that of the lowest priority,
-- written into the text when the queries are loaded:
-- publishing runs inside units of work that take only the queries and the
-- clock.
-- Every status change is guarded by the expected status and, after a claim,
-- by the lease token. Partial indexes are only used when a query spells their
-- condition literally (status = 'pending'), so statuses are never parameters.

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;

-- name: publish
-- One row; duplicates of (event_type, key) insert nothing and return no row.
INSERT INTO events (event_type, key, payload, headers, correlation_id, causation_id,
                    ordering_key, deliver_at, created_at, version, priority)
VALUES (:event_type, :key, :payload, :headers, :correlation_id, :causation_id,
        :ordering_key, :now + :delay_seconds, :now, :version, :priority)
ON CONFLICT (event_type, key) DO NOTHING
RETURNING id, deliver_at;

-- name: kept_key
-- The event that took this key for good (a publish with once=True); the event
-- itself may have been pruned since.
SELECT event_id FROM kept_keys WHERE event_type = :event_type AND key = :key;

-- name: keep_key
-- Keep a key for good, in the transaction of its event.
INSERT INTO kept_keys (event_type, key, event_id, created_at)
VALUES (:event_type, :key, :event_id, :now)
ON CONFLICT (event_type, key) DO NOTHING;

-- name: existing_id
-- The id of the event whose key an earlier publish took.
SELECT id FROM events WHERE event_type = :event_type AND key = :key;

-- name: subscribers
-- Fan-out targets of a batch, read once under the write lock (served by
-- subscriptions_event_type). A removed subscription gets nothing; a paused
-- one keeps its backlog growing until it is resumed.
SELECT event_type, id, ordered FROM subscriptions
WHERE event_type IN (SELECT value FROM json_each(:event_types)) AND state <> 'removed';

-- name: fanout
-- The delivery's place in the claim order is run_at + priority_wait.
INSERT INTO deliveries (event_id, subscription_id, ordering_key, run_at, updated_at, priority_wait)
VALUES (:event_id, :subscription_id, :ordering_key, :run_at, :now, :priority * {priority_step});

-- name: subscription_by_name
SELECT id, event_type, state, ordered FROM subscriptions WHERE name = :name;

-- name: subscription_insert
-- :served says a worker serving the subscription registers it.
INSERT INTO subscriptions (name, event_type, max_attempts, lease_seconds, ordered,
                           created_at, last_seen_at, worker_seen_at)
VALUES (:name, :event_type, :max_attempts, :lease_seconds, :ordered, :now, :now,
        CASE WHEN :served THEN :now END)
RETURNING id;

-- name: subscription_update
-- The state (paused, removed) is the operator's and is left alone.
UPDATE subscriptions
SET max_attempts = :max_attempts, lease_seconds = :lease_seconds, ordered = :ordered,
    last_seen_at = :now, worker_seen_at = CASE WHEN :served THEN :now ELSE worker_seen_at END
WHERE id = :id;

-- name: rekey
-- A subscription switched between ordered and unordered: its deliveries that
-- may still run (pending, and dead ones a replay can revive) take the new
-- mode's ordering key, the event's key when ordered and none otherwise.
-- Processing rows finish as they were claimed.
UPDATE deliveries
SET ordering_key = CASE WHEN :ordered
                        THEN (SELECT e.ordering_key FROM events e WHERE e.id = deliveries.event_id)
                   END
WHERE subscription_id = :subscription_id AND status IN ('pending', 'dead');

-- name: backfill
-- A new subscription reads the retained log from the start (events_type_id).
-- The WHERE clause is required: it keeps ON CONFLICT from parsing as a join.
INSERT INTO deliveries (event_id, subscription_id, ordering_key, run_at, updated_at, priority_wait)
SELECT e.id, :subscription_id, CASE WHEN :ordered THEN e.ordering_key END, e.deliver_at, :now,
       e.priority * {priority_step}
FROM events e WHERE e.event_type = :event_type
ORDER BY e.id
ON CONFLICT (event_id, subscription_id) DO NOTHING;

-- name: claim_probe
-- Read outside any transaction: is anything claimable? Spares the write lock
-- when the queue is empty, the subscription is paused or every key of an
-- ordered subscription is busy (deliveries_pending; the key checks are those
-- of claim_ordered, and always true for unkeyed rows).
SELECT 1 FROM deliveries d
WHERE subscription_id = :subscription_id AND status = 'pending'
  AND run_at <= (julianday('now') - 2440587.5) * 86400.0
  AND EXISTS (SELECT 1 FROM subscriptions WHERE id = :subscription_id AND state = 'active')
  AND (ordering_key IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM deliveries p
            WHERE p.subscription_id = :subscription_id AND p.ordering_key = d.ordering_key
              AND p.status = 'processing' AND p.ordering_key IS NOT NULL)
        AND NOT EXISTS (
            SELECT 1 FROM deliveries p
            WHERE p.subscription_id = :subscription_id AND p.ordering_key = d.ordering_key
              AND p.status IN ('pending', 'processing') AND p.event_id < d.event_id
              AND p.ordering_key IS NOT NULL)))
LIMIT 1;

-- name: claim
-- Take up to :limit runnable rows under a lease and a fresh token, in their
-- place order (run_at plus their priority's wait): one range of
-- deliveries_claim_order (named, so the planner never sorts the backlog),
-- from the start up to :now plus the wait of the lowest priority, past which
-- no row can be due. The "due now" test is on the index entry's run_at. The write lock makes SKIP LOCKED unnecessary. An unordered
-- claim clears the ordering key (already NULL unless the subscription was
-- ordered when the row was fanned out), so it can never trip
-- deliveries_one_per_key. Only an active subscription is claimed from.
UPDATE deliveries
SET status = 'processing', attempts = attempts + 1, lease_until = :now + :lease_seconds,
    lease_token = :lease_token, worker_id = :worker_id, ordering_key = NULL, updated_at = :now
WHERE id IN (
    SELECT id FROM deliveries INDEXED BY deliveries_claim_order
    WHERE subscription_id = :subscription_id AND status = 'pending'
      AND run_at + priority_wait <= :now + {max_priority_wait} AND run_at <= :now
      AND EXISTS (SELECT 1 FROM subscriptions WHERE id = :subscription_id AND state = 'active')
    ORDER BY run_at + priority_wait, run_at, id
    LIMIT :limit)
RETURNING id, event_id, attempts, ordering_key, run_at, run_at + priority_wait AS place;

-- name: claim_ordered
-- As claim, for subscriptions that are FIFO per key whatever the priorities:
-- a keyed row is taken only as the head of its key (no earlier delivery of the
-- key, by event id, is pending or processing) and only while no delivery of
-- the key is processing; a head waiting for its retry time blocks its key,
-- and a follower of a higher priority waits for its head. One probe per check
-- (deliveries_key_order, deliveries_one_per_key); the write lock makes the
-- checks exact.
UPDATE deliveries
SET status = 'processing', attempts = attempts + 1, lease_until = :now + :lease_seconds,
    lease_token = :lease_token, worker_id = :worker_id, updated_at = :now
WHERE id IN (
    SELECT d.id FROM deliveries d INDEXED BY deliveries_claim_order
    WHERE d.subscription_id = :subscription_id AND d.status = 'pending'
      AND d.run_at + d.priority_wait <= :now + {max_priority_wait} AND d.run_at <= :now
      AND EXISTS (SELECT 1 FROM subscriptions WHERE id = :subscription_id AND state = 'active')
      AND (ordering_key IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM deliveries p
            WHERE p.subscription_id = :subscription_id AND p.ordering_key = d.ordering_key
              AND p.status = 'processing' AND p.ordering_key IS NOT NULL)
        AND NOT EXISTS (
            SELECT 1 FROM deliveries p
            WHERE p.subscription_id = :subscription_id AND p.ordering_key = d.ordering_key
              AND p.status IN ('pending', 'processing') AND p.event_id < d.event_id
              AND p.ordering_key IS NOT NULL)))
    ORDER BY d.run_at + d.priority_wait, d.run_at, d.id
    LIMIT :limit)
RETURNING id, event_id, attempts, ordering_key, run_at, run_at + priority_wait AS place;

-- name: claimed_events
SELECT id, event_type, payload, headers, key, correlation_id, created_at, causation_id, version, priority
FROM events WHERE id IN (SELECT value FROM json_each(:event_ids));

-- name: complete
-- Fenced by (id, token); the caller inserts follow-ups only for completions
-- this returns a row for.
UPDATE deliveries
SET status = 'completed', lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id = :id AND status = 'processing' AND lease_token = :lease_token
RETURNING id;

-- name: fail
-- Retry (pending at :now + delay) or dead.
UPDATE deliveries
SET status = CASE WHEN :dead THEN 'dead' ELSE 'pending' END,
    run_at = CASE WHEN :dead THEN run_at ELSE :now + :delay_seconds END,
    last_error = :error_type || ': ' || :message,
    lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id = :id AND status = 'processing' AND lease_token = :lease_token
RETURNING id, attempts;

-- name: attempt_record
INSERT INTO delivery_attempts (delivery_id, attempt, error_type, message, traceback,
                               duration_seconds, worker_id, failed_at)
VALUES (:delivery_id, :attempt, :error_type, :message, :traceback, :duration_seconds,
        :worker_id, :now);

-- name: release
-- Hand back deliveries this worker claimed but will not finish, without
-- counting the attempt. run_at is kept (it was due when claimed), so a
-- delivery keeps its place in the queue.
UPDATE deliveries
SET status = 'pending', attempts = attempts - 1, lease_until = NULL, lease_token = NULL,
    updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status = 'processing' AND lease_token = :lease_token
RETURNING subscription_id;

-- name: extend
UPDATE deliveries
SET lease_until = :now + :lease_seconds
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status = 'processing' AND lease_token = :lease_token
RETURNING id;

-- name: recover_probe
-- Read outside any transaction: has any lease run out? (deliveries_lease_until)
SELECT 1 FROM deliveries
WHERE status = 'processing' AND lease_until < (julianday('now') - 2440587.5) * 86400.0
LIMIT 1;

-- name: recover_expired
-- Deliveries whose worker stopped renewing the lease: the attempt counts; they
-- go back to pending, or dead when out of attempts. run_at is kept (it was due
-- when claimed), so a delivery keeps its place.
UPDATE deliveries
SET status = CASE WHEN attempts >= (SELECT s.max_attempts FROM subscriptions s
                                    WHERE s.id = deliveries.subscription_id)
                  THEN 'dead' ELSE 'pending' END,
    last_error = 'LeaseExpired: the worker stopped renewing its lease',
    lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'processing' AND lease_until < :now
    ORDER BY lease_until
    LIMIT :limit)
RETURNING id, attempts, worker_id, subscription_id;

-- name: recover_record
INSERT INTO delivery_attempts (delivery_id, attempt, error_type, message, worker_id, failed_at)
VALUES (:delivery_id, :attempt, 'LeaseExpired', 'the worker stopped renewing its lease',
        :worker_id, :now);

-- name: next_run_in
-- When the subscription's next claimable delivery is due: the earliest pending
-- row that is unkeyed or the head of a key with nothing processing (as in
-- claim_ordered). No row when every key is busy: the worker then waits for a
-- completion or a wake-up instead of claiming again at once. None for a paused
-- or removed subscription: nothing of it will be claimable.
SELECT run_at - (julianday('now') - 2440587.5) * 86400.0
FROM deliveries d
WHERE subscription_id = :subscription_id AND status = 'pending'
  AND EXISTS (SELECT 1 FROM subscriptions WHERE id = :subscription_id AND state = 'active')
  AND (ordering_key IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM deliveries p
            WHERE p.subscription_id = :subscription_id AND p.ordering_key = d.ordering_key
              AND p.status = 'processing' AND p.ordering_key IS NOT NULL)
        AND NOT EXISTS (
            SELECT 1 FROM deliveries p
            WHERE p.subscription_id = :subscription_id AND p.ordering_key = d.ordering_key
              AND p.status IN ('pending', 'processing') AND p.event_id < d.event_id
              AND p.ordering_key IS NOT NULL)))
ORDER BY run_at
LIMIT 1;

-- name: worker_beat
INSERT INTO workers (id, hostname, pid, started_at, heartbeat_at, listener_ok,
                     listener_reconnects)
VALUES (:id, :hostname, :pid, :now, :now, :listener_ok, :listener_reconnects)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
    listener_ok = excluded.listener_ok, listener_reconnects = excluded.listener_reconnects;

-- name: subscriptions_seen
-- The subscriptions a live worker serves were seen by a worker now.
UPDATE subscriptions SET worker_seen_at = :now WHERE id IN (SELECT value FROM json_each(:ids));

-- name: worker_gone
DELETE FROM workers WHERE id = :id OR heartbeat_at < :now - 86400.0;

-- name: subscription_types
SELECT DISTINCT event_type FROM subscriptions
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: data_version
PRAGMA data_version;

-- name: lost_worker_candidates
-- Workers holding processing deliveries that are silent for :silent seconds,
-- or reported from host :hostname (whose process ids the caller can check).
SELECT w.id, w.hostname, w.pid, :now - w.heartbeat_at AS silent
FROM workers w
WHERE (w.heartbeat_at < :now - :silent OR w.hostname = :hostname)
  AND EXISTS (SELECT 1 FROM deliveries d WHERE d.status = 'processing' AND d.worker_id = w.id);

-- name: rescue
-- The processing deliveries of lost workers (a JSON array of ids), as
-- recover_expired: the attempt counts; back to pending, or dead when out of
-- attempts.
UPDATE deliveries
SET status = CASE WHEN attempts >= (SELECT s.max_attempts FROM subscriptions s
                                    WHERE s.id = deliveries.subscription_id)
                  THEN 'dead' ELSE 'pending' END,
    last_error = 'WorkerLost: its worker stopped reporting; taken back before its lease ran out',
    lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'processing' AND worker_id IN (SELECT value FROM json_each(:ids))
    ORDER BY id
    LIMIT :limit)
RETURNING id, attempts, worker_id, subscription_id;

-- name: rescue_record
INSERT INTO delivery_attempts (delivery_id, attempt, error_type, message, worker_id, failed_at)
VALUES (:delivery_id, :attempt, 'WorkerLost',
        'its worker stopped reporting; taken back before its lease ran out', :worker_id, :now);

-- name: rescue_count
UPDATE workers SET rescued = rescued + :n WHERE id = :id;
