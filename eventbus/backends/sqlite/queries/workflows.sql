-- Durable state machines on SQLite (the WorkflowStore port). Conventions as in
-- delivery.sql.

-- name: wf_load
-- The pointer as committed, read at the start of every visit (no state lives
-- in a worker between visits), with the database clock for age caps.
SELECT i.*, (julianday('now') - 2440587.5) * 86400.0 AS now,
       EXISTS (SELECT 1 FROM wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.run_id = i.run_id
                 AND s.consumed_version IS NULL)
           AS has_signals
FROM wf_instances i WHERE i.machine = :machine AND i.key = :key;

-- name: wf_facts
-- What the visits starting together decide on, in one read: each pointer with
-- the database clock, and whether its instance has open signals, approvals of
-- this run not yet used, or effects of this run (the reads after this one run
-- only for the instances that have some).
SELECT i.*, (julianday('now') - 2440587.5) * 86400.0 AS now,
       EXISTS (SELECT 1 FROM wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.run_id = i.run_id
                 AND s.consumed_version IS NULL)
           AS has_signals,
       EXISTS (SELECT 1 FROM wf_approvals a
               WHERE a.machine = i.machine AND a.key = i.key AND a.run_id = i.run_id
                 AND a.consumed_version IS NULL) AS has_approvals,
       EXISTS (SELECT 1 FROM wf_effects e
               WHERE e.machine = i.machine AND e.key = i.key AND e.run_id = i.run_id) AS has_effects,
       EXISTS (SELECT 1 FROM wf_children c
               WHERE c.parent_machine = i.machine AND c.parent_key = i.key
                 AND c.parent_run_id = i.run_id) AS has_children
FROM wf_instances i
WHERE i.machine = :machine AND i.key IN (SELECT value FROM json_each(:keys));

-- name: wf_facts_signals
-- The open signals of these runs (:runs is a JSON list of [key, run_id]), by key in arrival order.
SELECT s.key, s.id, s.run_id, s.name, s.dedupe, s.payload, s.created_at, s.consumed_version
FROM json_each(:runs) r
JOIN wf_signals s ON s.machine = :machine AND s.key = json_extract(r.value, '$[0]')
                 AND s.run_id = json_extract(r.value, '$[1]')
WHERE s.consumed_version IS NULL
ORDER BY s.key, s.id;

-- name: wf_facts_approvals
-- The approvals of these runs no transition used yet, by key, oldest first.
SELECT a.* FROM json_each(:runs) r
JOIN wf_approvals a ON a.machine = :machine AND a.key = json_extract(r.value, '$[0]')
                   AND a.run_id = json_extract(r.value, '$[1]')
WHERE a.consumed_version IS NULL
ORDER BY a.key, a.id;

-- name: wf_facts_effects
-- The effects recorded in these runs, by key, in the order they were recorded.
SELECT e.key, e.id, e.run_id, e.state, e.op_key, e.kind, e.ref, e.compensation, e.status
FROM json_each(:runs) r
JOIN wf_effects e ON e.machine = :machine AND e.key = json_extract(r.value, '$[0]')
                 AND e.run_id = json_extract(r.value, '$[1]')
ORDER BY e.key, e.id;

-- name: wf_facts_children
-- The child runs of these runs, by key, in the order they were started.
SELECT c.parent_key AS parent, c.machine, c.key, c.run_id, c.started, c.status, c.state,
       c.checkpoint, c.error_code, c.error, c.ended_at
FROM json_each(:runs) r
JOIN wf_children c ON c.parent_machine = :machine AND c.parent_key = json_extract(r.value, '$[0]')
                  AND c.parent_run_id = json_extract(r.value, '$[1]')
ORDER BY c.parent_key, c.rowid;

-- name: wf_start
-- Create the instance, or begin a new run of a finished one. A live run is
-- untouched and returns no row: starting is idempotent per key. With :once,
-- a completed run is untouched too (one statement under the write lock).
-- :priority is the run's: a new run of the key takes the new start's.
INSERT INTO wf_instances AS i (machine, key, state, status, checkpoint, next_run_at,
                               state_entered_at, run_started_at, created_at, updated_at, kept,
                               priority)
VALUES (:machine, :key, :state, 'pending', :checkpoint, :now, :now, :now, :now, :now, :once,
        :priority)
ON CONFLICT (machine, key) DO UPDATE
SET run_id = i.run_id + 1, kept = (i.kept OR excluded.kept), state = excluded.state, status = 'pending', version = i.version + 1,
    priority = excluded.priority,
    visits = '{}', attempts = 0, checkpoint = excluded.checkpoint, last_error_code = NULL,
    last_error = NULL, held_state = NULL, compensate_to = NULL, next_run_at = :now,
    state_entered_at = :now, run_started_at = :now, updated_at = :now,
    children_ended = 0, children_wait = NULL
WHERE i.status IN ('completed', 'failed', 'cancelled') AND NOT (:once AND i.status = 'completed')
RETURNING *, :now AS now, 0 AS has_signals;

-- name: wf_keep
-- A start with once=True found the key's run completed (started without
-- once, perhaps): mark it kept, so retention keeps what refuses the next start.
UPDATE wf_instances SET kept = 1
WHERE machine = :machine AND key = :key AND status = 'completed' AND NOT kept;

-- name: wf_move
-- The guarded transition: only from the version that was read and, for a
-- visit, only while its delivery's lease holds. No row back means a stale
-- visit; the caller writes nothing else. The run's priority comes back for
-- the next step, without reading the row again.
UPDATE wf_instances
SET state = :state, status = :status, version = version + 1, visits = :visits,
    attempts = :attempts, checkpoint = :checkpoint, last_error_code = :error_code,
    last_error = :error, held_state = :held_state, compensate_to = :compensate_to,
    next_run_at = CASE WHEN :next_run_in IS NULL THEN NULL ELSE :now + :next_run_in END,
    state_entered_at = CASE WHEN :entered THEN :now ELSE state_entered_at END,
    run_id = CASE WHEN :new_run THEN run_id + 1 ELSE run_id END,
    run_started_at = CASE WHEN :new_run THEN :now ELSE run_started_at END,
    updated_at = :now, children_wait = NULL
WHERE machine = :machine AND key = :key AND version = :expected_version
  AND (:lease_id IS NULL OR EXISTS (
        SELECT 1 FROM deliveries d
        WHERE d.id = :lease_id AND d.lease_token = :lease_token AND d.status = 'processing'))
RETURNING version, run_id, priority;

-- name: wf_history_insert
INSERT INTO wf_history (machine, key, run_id, version, state, visit, outcome, next_state, yielded,
                        error_code, error, actor, reason, delivery_id, started_at, at, woken_by)
VALUES (:machine, :key, :run_id, :version, :h_state, :visit, :outcome, :state, :yielded,
        :h_error_code, :h_error, :actor, :reason, :delivery_id, COALESCE(:started_at, :now), :now,
        :woken_by);

-- name: wf_consume_signals
-- Signals read by the visit are consumed by its transition, never before.
UPDATE wf_signals SET consumed_version = :version
WHERE machine = :machine AND key = :key AND consumed_version IS NULL
  AND id IN (SELECT value FROM json_each(:ids));

-- name: wf_signal_waiting
-- Is a signal of this run the state wakes on already here? Then its yield ends at once.
SELECT EXISTS (SELECT 1 FROM wf_signals
               WHERE machine = :machine AND key = :key AND run_id = :run_id
                 AND consumed_version IS NULL
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
-- decision is used once: the transition that acts on it (uses it, expires or
-- supersedes it) stamps its version, and no later visit reads it again.
UPDATE wf_approvals SET status = :status, consumed_version = :version
WHERE id = :id AND status = :expected AND consumed_version IS NULL;

-- name: wf_lock
-- Under the write lock already; read the pointer a signal or decision wakes
-- (with the run's priority, for the step that wakes it).
SELECT state, status, version, run_id, priority FROM wf_instances WHERE machine = :machine AND key = :key;

-- name: wf_hasten
-- A step due now pulls the instance's delayed steps (a tick waiting for its
-- poll) forward: the step subscription is FIFO per instance, so the earlier
-- tick is the head and would hold the wake-up back until its time.
UPDATE deliveries SET run_at = :now, updated_at = :now
WHERE subscription_id IN (SELECT id FROM subscriptions WHERE event_type = :event_type)
  AND ordering_key = :ordering_key AND status = 'pending' AND run_at > :now;

-- name: wf_signal_insert
-- For the live run read under the write lock; a dedupe id is unique within its run.
INSERT INTO wf_signals (machine, key, run_id, name, dedupe, payload, created_at)
VALUES (:machine, :key, :run_id, :name, :dedupe, :payload, :now)
ON CONFLICT (machine, key, run_id, name, dedupe) DO NOTHING
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

-- name: wf_counts_capped
-- As wf_counts, each group counted no further than :limit rows: the statuses,
-- then each status's states, are found by skipping through wf_instances_status
-- (one min() probe per group, not a read of every instance of the machine),
-- then each group's rows are counted from that index up to the limit.
WITH RECURSIVE statuses(status) AS (
    SELECT min(status) FROM wf_instances WHERE machine = :machine
    UNION ALL
    SELECT (SELECT min(i.status) FROM wf_instances i WHERE i.machine = :machine AND i.status > s.status)
    FROM statuses s WHERE s.status IS NOT NULL
), grp(status, state) AS (
    SELECT s.status, (SELECT min(i.state) FROM wf_instances i
                      WHERE i.machine = :machine AND i.status = s.status)
    FROM statuses s WHERE s.status IS NOT NULL
    UNION ALL
    SELECT g.status, (SELECT min(i.state) FROM wf_instances i
                      WHERE i.machine = :machine AND i.status = g.status AND i.state > g.state)
    FROM grp g WHERE g.state IS NOT NULL
)
SELECT g.state, g.status,
       (SELECT count(*) FROM (SELECT 1 FROM wf_instances i
                              WHERE i.machine = :machine AND i.status = g.status AND i.state = g.state
                              LIMIT :limit)) AS n
FROM grp g WHERE g.state IS NOT NULL;

-- name: wf_history
SELECT run_id, version, state, visit, outcome, next_state, yielded, error_code, error, actor,
       reason, delivery_id, started_at, at, woken_by
FROM wf_history WHERE machine = :machine AND key = :key ORDER BY version;

-- name: wf_signals
SELECT id, run_id, name, dedupe, payload, created_at, consumed_version FROM wf_signals
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
SELECT i.key, i.version, i.priority FROM wf_instances i
WHERE i.next_run_at < :now - :grace_seconds AND i.machine = :machine
  AND i.status IN ('pending', 'running', 'waiting', 'waiting_approval')
  AND NOT EXISTS (
        SELECT 1 FROM deliveries d JOIN subscriptions s ON s.id = d.subscription_id
        WHERE s.event_type = 'wf.step.' || i.machine AND d.ordering_key = i.machine || '/' || i.key
          AND d.status IN ('pending', 'processing'))
ORDER BY i.next_run_at LIMIT :limit;

-- name: wf_definition_record
-- The table a worker starts with becomes the one in force (a known one keeps
-- when it was first seen).
INSERT INTO wf_definitions (machine, def_hash, definition, first_registered_at, registered_at)
VALUES (:machine, :def_hash, :definition, :now, :now)
ON CONFLICT (machine, def_hash) DO UPDATE SET registered_at = :now;

-- name: wf_definition
-- The table in force: the one recorded most recently.
SELECT machine, def_hash, definition, first_registered_at, registered_at
FROM wf_definitions WHERE machine = :machine
ORDER BY registered_at DESC, def_hash LIMIT 1;

-- name: wf_child_link
-- A child run joins the parent's run in the parent's transition: the run of
-- (:child_machine, :child_key) the start just began, or the live (or, with
-- once, completed) one it left alone. A run that already ended is linked as
-- ended (the caller counts it); a link made twice is one.
INSERT INTO wf_children (parent_machine, parent_key, parent_run_id, machine, key, run_id, started,
                         status, state, checkpoint, error_code, error, linked_at, ended_at)
SELECT :machine, :key, :run_id, i.machine, i.key, i.run_id, :started, e.status, e.state, e.checkpoint,
       e.last_error_code, e.last_error, :now, CASE WHEN e.status IS NOT NULL THEN :now END
FROM wf_instances i
LEFT JOIN wf_instances e ON e.machine = i.machine AND e.key = i.key
                        AND e.status IN ('completed', 'failed', 'cancelled')
WHERE i.machine = :child_machine AND i.key = :child_key
ON CONFLICT DO NOTHING
RETURNING status;

-- name: wf_children_wait
-- The parent now waits on its children: the count it wakes at (-1: every
-- child of the run, counted now, the links of this transition included). Due
-- at once when that many have already ended; otherwise the child whose end
-- crosses it wakes the parent (wf_children_count), under the write lock.
UPDATE wf_instances
SET children_wait = CASE WHEN :wait >= 0 THEN :wait ELSE
        (SELECT count(*) FROM wf_children c
         WHERE c.parent_machine = wf_instances.machine AND c.parent_key = wf_instances.key
           AND c.parent_run_id = wf_instances.run_id)
    END
WHERE machine = :machine AND key = :key
RETURNING children_ended >= children_wait AS due;

-- name: wf_children_end
-- This instance just entered an ended status: the links of its run record
-- the outcome; returns the parent runs waiting on it, to be counted.
UPDATE wf_children
SET status = i.status, state = i.state, checkpoint = i.checkpoint, error_code = i.last_error_code,
    error = i.last_error, ended_at = :now
FROM wf_instances i
WHERE i.machine = :machine AND i.key = :key AND i.status IN ('completed', 'failed', 'cancelled')
  AND wf_children.machine = i.machine AND wf_children.key = i.key AND wf_children.run_id = i.run_id
  AND wf_children.status IS NULL
RETURNING parent_machine, parent_key, parent_run_id;

-- name: wf_children_count
-- One more child of the parent run ended. Ends are serialised by the write
-- lock, so exactly one of them moves the count onto children_wait: that one
-- gets the parent back (status, version) and wakes it if it is waiting.
UPDATE wf_instances SET children_ended = children_ended + :n
WHERE machine = :machine AND key = :key AND run_id = :run_id
RETURNING machine, key, version, priority, status, children_ended, children_wait;

-- name: wf_cancel_tree
-- The live runs a cancelled run started, and theirs, down the tree, with the
-- pointer each is at (only those still live are cancelled).
WITH RECURSIVE tree AS (
    SELECT c.machine, c.key, c.run_id FROM wf_children c
    WHERE c.parent_machine = :machine AND c.parent_key = :key AND c.parent_run_id = :run_id
      AND c.started AND c.status IS NULL
    UNION
    SELECT c.machine, c.key, c.run_id FROM wf_children c
    JOIN tree t ON c.parent_machine = t.machine AND c.parent_key = t.key AND c.parent_run_id = t.run_id
    WHERE c.started AND c.status IS NULL
)
SELECT i.machine, i.key, i.run_id, i.state, i.visits FROM wf_instances i
JOIN tree t ON i.machine = t.machine AND i.key = t.key AND i.run_id = t.run_id
WHERE i.status IN ('pending', 'running', 'waiting', 'waiting_approval', 'paused', 'uncertain')
ORDER BY i.machine, i.key;

-- name: wf_cancel_child
-- A descendant of a cancelled run moves to CANCELLED under a new version,
-- fencing a visit in flight; its history row names the cancelled ancestor.
UPDATE wf_instances
SET state = 'CANCELLED', status = 'cancelled', version = version + 1, next_run_at = NULL,
    children_wait = NULL, state_entered_at = :now, updated_at = :now
WHERE machine = :machine AND key = :key AND run_id = :run_id
RETURNING version;
