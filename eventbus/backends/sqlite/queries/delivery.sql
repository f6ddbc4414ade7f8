-- Queries of the SQLite backend, with :named parameters.
-- Every write runs inside one BEGIN IMMEDIATE transaction on the process's
-- writer connection; :now is the database clock read once at its start
-- (REAL epoch seconds), so one transaction sees one time, as now() does in
-- PostgreSQL. Arrays travel as JSON text and are opened with json_each.
-- Every status change is guarded by the expected status and, after a claim,
-- by the lease token. Partial indexes are only used when a query spells their
-- condition literally (status = 'pending'), so statuses are never parameters.

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;

-- name: publish
-- One row; duplicates of (event_type, key) insert nothing and return no row.
INSERT INTO events (event_type, key, payload, headers, correlation_id, causation_id,
                    ordering_key, deliver_at, created_at)
VALUES (:event_type, :key, :payload, :headers, :correlation_id, :causation_id,
        :ordering_key, :now + :delay_seconds, :now)
ON CONFLICT (event_type, key) DO NOTHING
RETURNING id, deliver_at;

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
INSERT INTO deliveries (event_id, subscription_id, ordering_key, run_at, updated_at)
VALUES (:event_id, :subscription_id, :ordering_key, :run_at, :now);

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
INSERT INTO deliveries (event_id, subscription_id, ordering_key, run_at, updated_at)
SELECT e.id, :subscription_id, CASE WHEN :ordered THEN e.ordering_key END, e.deliver_at, :now
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
-- Take up to :limit runnable rows (deliveries_pending) under a lease and a
-- fresh token. The write lock makes SKIP LOCKED unnecessary. An unordered
-- claim clears the ordering key (already NULL unless the subscription was
-- ordered when the row was fanned out), so it can never trip
-- deliveries_one_per_key. Only an active subscription is claimed from.
UPDATE deliveries
SET status = 'processing', attempts = attempts + 1, lease_until = :now + :lease_seconds,
    lease_token = :lease_token, worker_id = :worker_id, ordering_key = NULL, updated_at = :now
WHERE id IN (
    SELECT id FROM deliveries
    WHERE subscription_id = :subscription_id AND status = 'pending' AND run_at <= :now
      AND EXISTS (SELECT 1 FROM subscriptions WHERE id = :subscription_id AND state = 'active')
    ORDER BY run_at, id
    LIMIT :limit)
RETURNING id, event_id, attempts, ordering_key, run_at;

-- name: claim_ordered
-- As claim, for subscriptions that are FIFO per key: a keyed row is taken only
-- as the head of its key (no earlier delivery of the key, by event id, is
-- pending or processing) and only while no delivery of the key is processing;
-- a head waiting for its retry time blocks its key. One probe per check
-- (deliveries_key_order, deliveries_one_per_key); the write lock makes the
-- checks exact.
UPDATE deliveries
SET status = 'processing', attempts = attempts + 1, lease_until = :now + :lease_seconds,
    lease_token = :lease_token, worker_id = :worker_id, updated_at = :now
WHERE id IN (
    SELECT d.id FROM deliveries d
    WHERE d.subscription_id = :subscription_id AND d.status = 'pending' AND d.run_at <= :now
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
    ORDER BY d.run_at, d.id
    LIMIT :limit)
RETURNING id, event_id, attempts, ordering_key, run_at;

-- name: claimed_events
SELECT id, event_type, payload, headers, key, correlation_id, created_at, causation_id
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

-- name: status
-- Counted on the narrow table alone: a subscription has one event type.
SELECT s.event_type, s.name AS subscription, c.status, c.count
FROM (SELECT subscription_id, status, count(*) AS count
      FROM deliveries GROUP BY 1, 2) c
JOIN subscriptions s ON s.id = c.subscription_id
ORDER BY 1, 2, 3;

-- name: status_oldest_pending
SELECT (julianday('now') - 2440587.5) * 86400.0 - min(run_at)
FROM deliveries
WHERE status = 'pending' AND run_at <= (julianday('now') - 2440587.5) * 86400.0;

-- name: status_events
SELECT count(*) FROM events;

-- name: status_workers
SELECT id, hostname, pid, started_at, heartbeat_at, listener_ok, listener_reconnects,
       (julianday('now') - 2440587.5) * 86400.0 - heartbeat_at AS silent_seconds
FROM workers ORDER BY started_at;

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

-- name: detail
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at
FROM deliveries d
JOIN subscriptions s ON s.id = d.subscription_id
JOIN events e ON e.id = d.event_id
WHERE d.id = :id;

-- name: history
SELECT attempt, error_type, message, traceback, coalesce(duration_seconds, 0.0),
       worker_id, failed_at
FROM delivery_attempts WHERE delivery_id = :id ORDER BY id;

-- name: list_dead
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at
FROM deliveries d
JOIN subscriptions s ON s.id = d.subscription_id
JOIN events e ON e.id = d.event_id
WHERE d.status = 'dead'
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND (:subscription IS NULL OR s.name = :subscription)
  AND (:event_type IS NULL OR e.event_type = :event_type)
  AND (:since IS NULL OR d.updated_at >= :since)
  AND d.id > :after_id
ORDER BY d.id
LIMIT :limit;

-- name: dead_ids
-- As list_dead, ids only: the next batch of a replay or purge.
SELECT d.id
FROM deliveries d
JOIN subscriptions s ON s.id = d.subscription_id
JOIN events e ON e.id = d.event_id
WHERE d.status = 'dead'
  AND (:ids IS NULL OR d.id IN (SELECT value FROM json_each(:ids)))
  AND (:subscription IS NULL OR s.name = :subscription)
  AND (:event_type IS NULL OR e.event_type = :event_type)
  AND (:since IS NULL OR d.updated_at >= :since)
  AND d.id > :after_id
ORDER BY d.id
LIMIT :limit;

-- name: replay
-- Guarded dead -> pending, attempts reset, replay count and time kept. A
-- removed subscription's dead rows stay dead: no worker would take them.
UPDATE deliveries
SET status = 'pending', attempts = 0, run_at = :now, replays = replays + 1,
    replayed_at = :now, lease_until = NULL, lease_token = NULL, updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'dead'
  AND subscription_id NOT IN (SELECT id FROM subscriptions WHERE state = 'removed')
RETURNING subscription_id;

-- name: subscription_types
SELECT DISTINCT event_type FROM subscriptions
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: purge
DELETE FROM deliveries WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'dead'
RETURNING id;

-- name: purge_history
DELETE FROM delivery_attempts WHERE delivery_id IN (SELECT value FROM json_each(:ids));

-- name: cancel
UPDATE deliveries SET status = 'cancelled', updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'pending'
RETURNING id;

-- name: data_version
PRAGMA data_version;

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    checksum   TEXT NOT NULL,
    applied_at REAL NOT NULL
);

-- name: migrations_applied
SELECT version, checksum FROM schema_migrations;

-- name: migration_record
INSERT INTO schema_migrations (version, name, checksum, applied_at)
VALUES (:version, :name, :checksum, :now);

-- name: schedule_rows
-- Declaring schedules: read under the write lock, so two starting workers
-- apply their declarations one after the other.
SELECT * FROM schedules WHERE name IN (SELECT value FROM json_each(:names)) ORDER BY name;

-- name: schedule_declare
-- Create, or update spec and policies in place; the times restart only when
-- :reset says so, recorded occurrences stay.
INSERT INTO schedules (name, target_kind, target, cron, every_seconds, anchor, timezone,
    missed, max_catchup, overlap, cooldown_seconds, jitter_seconds, dst_gap, dst_fold,
    next_occurrence_at, next_run_at, created_at, updated_at)
VALUES (:name, :target_kind, :target, :cron, :every_seconds, :anchor, :timezone,
    :missed, :max_catchup, :overlap, :cooldown_seconds, :jitter_seconds, :dst_gap, :dst_fold,
    :first, :first, :now, :now)
ON CONFLICT (name) DO UPDATE SET
    target_kind = excluded.target_kind, target = excluded.target, cron = excluded.cron,
    every_seconds = excluded.every_seconds, anchor = excluded.anchor, timezone = excluded.timezone,
    missed = excluded.missed, max_catchup = excluded.max_catchup, overlap = excluded.overlap,
    cooldown_seconds = excluded.cooldown_seconds, jitter_seconds = excluded.jitter_seconds,
    dst_gap = excluded.dst_gap, dst_fold = excluded.dst_fold,
    next_occurrence_at = CASE WHEN :reset THEN excluded.next_occurrence_at ELSE next_occurrence_at END,
    next_run_at = CASE WHEN :reset THEN excluded.next_run_at ELSE next_run_at END,
    updated_at = :now;

-- name: schedule_set_known
SELECT 1 FROM schedule_sets WHERE set_id = :set_id;

-- name: schedule_set_record
INSERT INTO schedule_sets (set_id, declared_at) VALUES (:set_id, :now) ON CONFLICT DO NOTHING;

-- name: schedule_set_name
INSERT INTO schedule_declarations (set_id, name) VALUES (:set_id, :name) ON CONFLICT DO NOTHING;

-- name: schedule_probe
-- Read outside any transaction: is a schedule of this process's declaration
-- set due? Spares the write lock when none is (schedules_due).
SELECT 1 FROM schedules s
WHERE s.next_run_at <= (julianday('now') - 2440587.5) * 86400.0
  AND (s.paused_at IS NULL OR s.requested = 1)
  AND EXISTS (SELECT 1 FROM schedule_declarations d WHERE d.set_id = :set_id AND d.name = s.name)
LIMIT 1;

-- name: schedule_claim
-- The tick, under the write lock (no other tick runs at once): up to :limit
-- due schedules of this process's declaration set (schedules_due, then one
-- primary-key probe per due row; time is the database's).
SELECT s.* FROM schedules s
WHERE s.next_run_at <= :now AND (s.paused_at IS NULL OR s.requested = 1)
  AND EXISTS (SELECT 1 FROM schedule_declarations d WHERE d.set_id = :set_id AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT :limit;

-- name: schedule_work_open
-- Whether the last fired event's work has finished: every delivery terminal.
SELECT count(*) FILTER (WHERE status IN ('pending', 'processing')) AS open, max(updated_at) AS last
FROM deliveries WHERE event_id = :event_id;

-- name: schedule_finished_occurrence
UPDATE schedule_occurrences SET finished_at = :finished
WHERE schedule = :name AND event_id = :event_id AND status = 'fired' AND finished_at IS NULL;

-- name: schedule_finished
UPDATE schedules SET last_finished_at = :finished
WHERE name = :name AND last_event_id = :event_id AND last_finished_at IS NULL;

-- name: schedule_requested
SELECT scheduled_for FROM schedule_occurrences
WHERE schedule = :name AND status = 'requested'
ORDER BY scheduled_for
LIMIT :limit;

-- name: occurrence_insert
-- A new occurrence with its fate; a time already recorded keeps its row.
INSERT INTO schedule_occurrences (schedule, scheduled_for, status, event_id, fired_at, recorded_at)
VALUES (:name, :at, :status, :event_id, CASE WHEN :status = 'fired' THEN :now END, :now)
ON CONFLICT (schedule, scheduled_for) DO NOTHING;

-- name: occurrence_fire
-- A requested or buffered occurrence fires now (guarded by its status).
UPDATE schedule_occurrences SET status = 'fired', event_id = :event_id, fired_at = :now
WHERE schedule = :name AND scheduled_for = :at AND status IN ('requested', 'buffered');

-- name: schedule_advance
-- Move the schedule on, guarded by the occurrence it was claimed at.
UPDATE schedules
SET next_occurrence_at = :next_occurrence_at, next_run_at = :next_run_at,
    buffered_for = :buffered_for,
    last_run_at = CASE WHEN :last_event_id IS NULL THEN last_run_at ELSE :now END,
    last_event_id = coalesce(:last_event_id, last_event_id),
    last_finished_at = CASE WHEN :last_event_id IS NULL THEN last_finished_at END,
    requested = :requested, updated_at = :now
WHERE name = :name AND next_occurrence_at = :claimed_at
RETURNING name;

-- name: schedule_next_due
-- Seconds until the earliest schedule of the set is due: the first row of
-- schedules_due that belongs to it.
SELECT s.next_run_at - (julianday('now') - 2440587.5) * 86400.0 FROM schedules s
WHERE (s.paused_at IS NULL OR s.requested = 1)
  AND EXISTS (SELECT 1 FROM schedule_declarations d WHERE d.set_id = :set_id AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT 1;

-- name: schedules_list
SELECT * FROM schedules WHERE :name IS NULL OR name = :name ORDER BY name;

-- name: occurrences_list
-- Newest first; a fired occurrence whose finish the tick has not recorded yet
-- is computed from its deliveries (finished = every delivery terminal).
SELECT o.schedule, o.scheduled_for, o.status, o.event_id, o.fired_at,
       coalesce(o.finished_at, CASE WHEN o.status = 'fired' THEN (
           SELECT CASE WHEN count(*) FILTER (WHERE d.status IN ('pending', 'processing')) = 0
                       THEN coalesce(max(d.updated_at), o.fired_at) END
           FROM deliveries d WHERE d.event_id = o.event_id) END) AS finished_at
FROM schedule_occurrences o
WHERE o.schedule = :name
ORDER BY o.scheduled_for DESC
LIMIT :limit;

-- name: schedule_pause
UPDATE schedules
SET paused_at = CASE WHEN :paused THEN coalesce(paused_at, :now) END, updated_at = :now
WHERE name = :name
RETURNING name;

-- name: schedule_remove
DELETE FROM schedules WHERE name = :name RETURNING name;

-- name: schedule_remove_occurrences
DELETE FROM schedule_occurrences WHERE schedule = :name;

-- name: schedule_request
-- An operator asked for occurrences: have the next tick look at the schedule now.
UPDATE schedules
SET requested = 1, next_run_at = min(next_run_at, :now), updated_at = :now
WHERE name = :name
RETURNING name;

-- name: occurrence_request
-- Record a requested occurrence; a skipped one is requested again, a fired or
-- waiting one is left alone (each fires at most once).
INSERT INTO schedule_occurrences AS o (schedule, scheduled_for, status, recorded_at)
VALUES (:name, :at, 'requested', :now)
ON CONFLICT (schedule, scheduled_for) DO UPDATE SET status = 'requested'
    WHERE o.status IN ('skipped_missed', 'skipped_overlap')
RETURNING scheduled_for;
-- Durable state machines ----------------------------------------------------

-- name: wf_load
-- The pointer as committed, read at the start of every visit (no state lives
-- in a worker between visits), with the database clock for age caps.
SELECT i.*, (julianday('now') - 2440587.5) * 86400.0 AS now,
       EXISTS (SELECT 1 FROM wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.consumed_version IS NULL)
           AS has_signals
FROM wf_instances i WHERE i.machine = :machine AND i.key = :key;

-- name: wf_load_many
-- wf_load for the visits starting together (one read for the batch).
SELECT i.*, (julianday('now') - 2440587.5) * 86400.0 AS now,
       EXISTS (SELECT 1 FROM wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.consumed_version IS NULL)
           AS has_signals
FROM wf_instances i
WHERE i.machine = :machine AND i.key IN (SELECT value FROM json_each(:keys));

-- name: wf_start
-- Create the instance, or begin a new run of a finished one. A live run is
-- untouched and returns no row: starting is idempotent per key.
INSERT INTO wf_instances AS i (machine, key, state, status, checkpoint, next_run_at,
                               state_entered_at, run_started_at, created_at, updated_at)
VALUES (:machine, :key, :state, 'pending', :checkpoint, :now, :now, :now, :now, :now)
ON CONFLICT (machine, key) DO UPDATE
SET run_id = i.run_id + 1, state = excluded.state, status = 'pending', version = i.version + 1,
    visits = '{}', attempts = 0, checkpoint = excluded.checkpoint, last_error_code = NULL,
    last_error = NULL, held_state = NULL, compensate_to = NULL, next_run_at = :now,
    state_entered_at = :now, run_started_at = :now, updated_at = :now
WHERE i.status IN ('completed', 'failed', 'cancelled')
RETURNING *, :now AS now, 0 AS has_signals;

-- name: wf_move
-- The guarded transition: only from the version that was read and, for a
-- visit, only while its delivery's lease holds. No row back means a stale
-- visit; the caller writes nothing else.
UPDATE wf_instances
SET state = :state, status = :status, version = version + 1, visits = :visits,
    attempts = :attempts, checkpoint = :checkpoint, last_error_code = :error_code,
    last_error = :error, held_state = :held_state, compensate_to = :compensate_to,
    next_run_at = CASE WHEN :next_run_in IS NULL THEN NULL ELSE :now + :next_run_in END,
    state_entered_at = CASE WHEN :entered THEN :now ELSE state_entered_at END,
    run_id = CASE WHEN :new_run THEN run_id + 1 ELSE run_id END,
    run_started_at = CASE WHEN :new_run THEN :now ELSE run_started_at END,
    updated_at = :now
WHERE machine = :machine AND key = :key AND version = :expected_version
  AND (:lease_id IS NULL OR EXISTS (
        SELECT 1 FROM deliveries d
        WHERE d.id = :lease_id AND d.lease_token = :lease_token AND d.status = 'processing'))
RETURNING version, run_id;

-- name: wf_history_insert
INSERT INTO wf_history (machine, key, run_id, version, state, visit, outcome, next_state, yielded,
                        error_code, error, actor, reason, delivery_id, started_at, at)
VALUES (:machine, :key, :run_id, :version, :h_state, :visit, :outcome, :state, :yielded,
        :h_error_code, :h_error, :actor, :reason, :delivery_id, COALESCE(:started_at, :now), :now);

-- name: wf_consume_signals
-- Signals read by the visit are consumed by its transition, never before.
UPDATE wf_signals SET consumed_version = :version
WHERE machine = :machine AND key = :key AND consumed_version IS NULL
  AND id IN (SELECT value FROM json_each(:ids));

-- name: wf_signal_waiting
-- Is a signal the state wakes on already here? Then its yield ends at once.
SELECT EXISTS (SELECT 1 FROM wf_signals
               WHERE machine = :machine AND key = :key AND consumed_version IS NULL
                 AND name IN (SELECT value FROM json_each(:names)));

-- name: wf_effect_insert
INSERT INTO wf_effects (machine, key, run_id, state, op_key, kind, ref, compensation, created_at)
VALUES (:machine, :key, :run_id, :state, :op_key, :kind, :ref, :compensation, :now);

-- name: wf_effect_status
UPDATE wf_effects SET status = :status WHERE id = :id AND status <> 'compensated';

-- name: wf_approval_request
INSERT INTO wf_approvals (machine, key, run_id, state, input, input_hash, status, requested_at,
                          expires_at)
VALUES (:machine, :key, :run_id, :state, :input, :input_hash, 'pending', :now,
        :now + :timeout_seconds);

-- name: wf_approval_update
-- Guarded by the status the visit saw (a decision that raced it wins); a
-- decision is used once: the transition that acts on it stamps its version.
UPDATE wf_approvals
SET status = :status,
    consumed_version = CASE WHEN :status IN ('approved', 'denied') THEN :version END
WHERE id = :id AND status = :expected AND consumed_version IS NULL;

-- name: wf_lock
-- Under the write lock already; read the pointer a signal or decision wakes.
SELECT state, status, version FROM wf_instances WHERE machine = :machine AND key = :key;

-- name: wf_hasten
-- A step due now pulls the instance's delayed steps (a tick waiting for its
-- poll) forward: the step subscription is FIFO per instance, so the earlier
-- tick is the head and would hold the wake-up back until its time.
UPDATE deliveries SET run_at = :now, updated_at = :now
WHERE subscription_id IN (SELECT id FROM subscriptions WHERE event_type = :event_type)
  AND ordering_key = :ordering_key AND status = 'pending' AND run_at > :now;

-- name: wf_signal_insert
INSERT INTO wf_signals (machine, key, name, dedupe, payload, created_at)
VALUES (:machine, :key, :name, :dedupe, :payload, :now)
ON CONFLICT (machine, key, name, dedupe) DO NOTHING
RETURNING id;

-- name: wf_decide
-- Single use: only a pending, unexpired approval can be decided, once.
UPDATE wf_approvals
SET status = :status, decided_by = :by, decided_at = :now, reason = :reason
WHERE id = :id AND status = 'pending' AND expires_at > :now
RETURNING *;

-- name: wf_list
SELECT i.*, (julianday('now') - 2440587.5) * 86400.0 AS now, 0 AS has_signals
FROM wf_instances i
WHERE i.machine = :machine AND (:status IS NULL OR i.status = :status)
  AND (:state IS NULL OR i.state = :state)
ORDER BY i.key LIMIT :limit;

-- name: wf_counts
SELECT state, status, count(*) AS n FROM wf_instances WHERE machine = :machine
GROUP BY state, status;

-- name: wf_history
SELECT run_id, version, state, visit, outcome, next_state, yielded, error_code, error, actor,
       reason, delivery_id, started_at, at
FROM wf_history WHERE machine = :machine AND key = :key ORDER BY version;

-- name: wf_signals
SELECT id, name, dedupe, payload, created_at, consumed_version FROM wf_signals
WHERE machine = :machine AND key = :key AND (NOT :open_only OR consumed_version IS NULL)
ORDER BY id;

-- name: wf_approvals
SELECT * FROM wf_approvals WHERE machine = :machine AND key = :key ORDER BY id;

-- name: wf_approval
SELECT * FROM wf_approvals WHERE id = :id;

-- name: wf_effects
SELECT id, run_id, state, op_key, kind, ref, compensation, status FROM wf_effects
WHERE machine = :machine AND key = :key AND run_id = :run_id ORDER BY id;

-- name: wf_sweep
-- Live instances overdue by more than the grace with no step pending or
-- processing: their tick was lost (a dead or cancelled step delivery).
SELECT i.key, i.version FROM wf_instances i
WHERE i.next_run_at < :now - :grace_seconds AND i.machine = :machine
  AND i.status IN ('pending', 'running', 'waiting', 'waiting_approval')
  AND NOT EXISTS (
        SELECT 1 FROM deliveries d JOIN subscriptions s ON s.id = d.subscription_id
        WHERE s.event_type = 'wf.step.' || i.machine AND d.ordering_key = i.machine || '/' || i.key
          AND d.status IN ('pending', 'processing'))
ORDER BY i.next_run_at LIMIT :limit;

-- ---------------------------------------------------------------------------
-- Observability and retention (Inspector.chain/health, RetentionStore).

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
JOIN subscriptions s ON s.id = d.subscription_id
JOIN events e ON e.id = d.event_id
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

-- name: find_deliveries
-- The dashboard's delivery list: every filter optional, newest first below a
-- cursor id (one descending walk of the primary key, however deep the page).
-- The payload filter parses JSON only for rows the cheaper filters kept.
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.correlation_id, d.last_error, d.replays, d.run_at, d.updated_at, e.created_at
FROM deliveries d
JOIN subscriptions s ON s.id = d.subscription_id
JOIN events e ON e.id = d.event_id
WHERE (:subscription IS NULL OR s.name = :subscription)
  AND (:status IS NULL OR d.status = :status)
  AND (:event_type IS NULL OR e.event_type = :event_type)
  AND (:event_id IS NULL OR d.event_id = :event_id)
  AND (:key IS NULL OR e.key = :key)
  AND (:correlation_id IS NULL OR e.correlation_id = :correlation_id OR e.id = :correlation_id)
  AND (:since IS NULL OR d.updated_at >= :since)
  AND (:until IS NULL OR d.updated_at < :until)
  AND (:path IS NULL OR (CASE json_type(CAST(e.payload AS TEXT), :path)
        WHEN 'true' THEN 'true' WHEN 'false' THEN 'false'
        ELSE CAST(json_extract(CAST(e.payload AS TEXT), :path) AS TEXT) END) = :payload_value)
  AND (:before_id IS NULL OR d.id < :before_id)
ORDER BY d.id DESC
LIMIT :limit;

-- name: count_deliveries
-- As find_deliveries, counted no further than :cap rows: a capped count stays
-- fast at millions of rows and the page shows "N+".
SELECT count(*) FROM (
    SELECT 1
    FROM deliveries d
    JOIN subscriptions s ON s.id = d.subscription_id
    JOIN events e ON e.id = d.event_id
    WHERE (:subscription IS NULL OR s.name = :subscription)
      AND (:status IS NULL OR d.status = :status)
      AND (:event_type IS NULL OR e.event_type = :event_type)
      AND (:event_id IS NULL OR d.event_id = :event_id)
      AND (:key IS NULL OR e.key = :key)
      AND (:correlation_id IS NULL OR e.correlation_id = :correlation_id OR e.id = :correlation_id)
      AND (:since IS NULL OR d.updated_at >= :since)
      AND (:until IS NULL OR d.updated_at < :until)
      AND (:path IS NULL OR (CASE json_type(CAST(e.payload AS TEXT), :path)
            WHEN 'true' THEN 'true' WHEN 'false' THEN 'false'
            ELSE CAST(json_extract(CAST(e.payload AS TEXT), :path) AS TEXT) END) = :payload_value)
    LIMIT :cap
);

-- name: event_row
SELECT id, event_type, key, payload, headers, correlation_id, causation_id, created_at
FROM events WHERE id = :id;

-- name: event_deliveries
-- Every delivery of one event (the unique (event_id, subscription_id) index finds them).
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at
FROM deliveries d
JOIN subscriptions s ON s.id = d.subscription_id
JOIN events e ON e.id = d.event_id
WHERE d.event_id = :id
ORDER BY s.name;

-- name: event_history
-- The failed attempts of every delivery of one event, oldest first.
SELECT a.delivery_id, a.attempt, a.error_type, a.message, a.traceback,
       coalesce(a.duration_seconds, 0.0), a.worker_id, a.failed_at
FROM delivery_attempts a
JOIN deliveries d ON d.id = a.delivery_id
WHERE d.event_id = :id
ORDER BY a.id;

-- name: event_chain
-- The root of the event's chain and every event carrying that root as its
-- correlation id; causation_id links each to its parent.
WITH root AS (SELECT coalesce(correlation_id, id) AS id FROM events WHERE id = :id)
SELECT e.id, e.event_type, e.key, e.correlation_id, e.causation_id, e.created_at
FROM events e, root
WHERE e.id = root.id OR e.correlation_id = root.id
ORDER BY e.id
LIMIT :limit;
