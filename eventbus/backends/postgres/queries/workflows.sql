-- Durable state machines of the PostgreSQL backend (PgWorkflows). {schema} is
-- the validated, quoted schema.

-- name: wf_load
-- The pointer as committed, read at the start of every visit (no state lives
-- in a worker between visits), with the database clock for age caps.
SELECT i.*, now() AS now,
       EXISTS (SELECT 1 FROM {schema}.wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.run_id = i.run_id
                 AND s.consumed_version IS NULL)
           AS has_signals
FROM {schema}.wf_instances i WHERE i.machine = $1 AND i.key = $2;

-- name: wf_facts
-- What the visits starting together decide on, in one round trip: each
-- pointer with the database clock, and whether its instance has open signals,
-- approvals of this run not yet used, or effects of this run (the three reads
-- after this one run only for the instances that have some).
SELECT i.*, now() AS now,
       EXISTS (SELECT 1 FROM {schema}.wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.run_id = i.run_id
                 AND s.consumed_version IS NULL)
           AS has_signals,
       EXISTS (SELECT 1 FROM {schema}.wf_approvals a
               WHERE a.machine = i.machine AND a.key = i.key AND a.run_id = i.run_id
                 AND a.consumed_version IS NULL) AS has_approvals,
       EXISTS (SELECT 1 FROM {schema}.wf_effects e
               WHERE e.machine = i.machine AND e.key = i.key AND e.run_id = i.run_id) AS has_effects,
       EXISTS (SELECT 1 FROM {schema}.wf_children c
               WHERE c.parent_machine = i.machine AND c.parent_key = i.key
                 AND c.parent_run_id = i.run_id) AS has_children
FROM {schema}.wf_instances i WHERE i.machine = $1 AND i.key = ANY($2::text[]);

-- name: wf_facts_signals
-- The open signals of these runs (keys with their run ids), by key in arrival order.
SELECT s.key, s.id, s.run_id, s.name, s.dedupe, s.payload, s.created_at, s.consumed_version
FROM {schema}.wf_signals s
JOIN unnest($2::text[], $3::int[]) AS t(key, run_id) ON s.key = t.key AND s.run_id = t.run_id
WHERE s.machine = $1 AND s.consumed_version IS NULL
ORDER BY s.key, s.id;

-- name: wf_facts_approvals
-- The approvals of these runs no transition used yet, by key, oldest first.
SELECT a.* FROM {schema}.wf_approvals a
JOIN unnest($2::text[], $3::int[]) AS t(key, run_id) ON a.key = t.key AND a.run_id = t.run_id
WHERE a.machine = $1 AND a.consumed_version IS NULL
ORDER BY a.key, a.id;

-- name: wf_facts_effects
-- The effects recorded in these runs, by key, in the order they were recorded.
SELECT e.key, e.id, e.run_id, e.state, e.op_key, e.kind, e.ref, e.compensation, e.status
FROM {schema}.wf_effects e
JOIN unnest($2::text[], $3::int[]) AS t(key, run_id) ON e.key = t.key AND e.run_id = t.run_id
WHERE e.machine = $1
ORDER BY e.key, e.id;

-- name: wf_facts_children
-- The child runs of these runs, by key, in the order they were started.
SELECT c.parent_key AS parent, c.machine, c.key, c.run_id, c.started,
       c.status, c.state, c.checkpoint, c.error_code, c.error, c.ended_at
FROM {schema}.wf_children c
JOIN unnest($2::text[], $3::int[]) AS t(key, run_id) ON c.parent_key = t.key AND c.parent_run_id = t.run_id
WHERE c.parent_machine = $1
ORDER BY c.parent_key, c.seq;

-- name: wf_start
-- Create the instance, or begin a new run of a finished one. A live run is
-- untouched and returns no row: starting is idempotent per key. With $5
-- (start once), a completed run is untouched too. The conflict takes the row
-- lock before the WHERE is read, so of concurrent starts exactly one begins.
-- $6 is the run's priority: a new run of the key takes the new start's.
INSERT INTO {schema}.wf_instances AS i (machine, key, state, status, checkpoint, next_run_at, kept,
                                        priority)
VALUES ($1, $2, $3, 'pending', $4, now(), $5, $6)
ON CONFLICT (machine, key) DO UPDATE
SET run_id = i.run_id + 1, kept = i.kept OR EXCLUDED.kept, state = EXCLUDED.state, status = 'pending', version = i.version + 1,
    priority = EXCLUDED.priority,
    visits = '{}', attempts = 0, checkpoint = EXCLUDED.checkpoint, last_error_code = NULL,
    last_error = NULL, held_state = NULL, compensate_to = NULL, next_run_at = now(),
    state_entered_at = now(), run_started_at = now(), updated_at = now(),
    children_ended = 0, children_wait = NULL
WHERE i.status IN ('completed', 'failed', 'cancelled') AND NOT ($5::boolean AND i.status = 'completed')
RETURNING i.*, now() AS now, false AS has_signals;

-- name: wf_start_many
-- wf_start for the child runs a transition starts, in one statement (one
-- round trip, where one per child bounded a fan-out of thousands): each key
-- is guarded as wf_start guards it ($5 is each start's once). The caller
-- passes each key once, sorted, so concurrent fan-outs lock in one order.
-- $6 is each run's priority, returned for its first step.
INSERT INTO {schema}.wf_instances AS i (machine, key, state, status, checkpoint, next_run_at, kept,
                                        priority)
SELECT t.machine, t.key, t.state, 'pending', t.checkpoint, now(), t.once, t.priority
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::boolean[], $6::smallint[])
     AS t(machine, key, state, checkpoint, once, priority)
ON CONFLICT (machine, key) DO UPDATE
SET run_id = i.run_id + 1, kept = i.kept OR EXCLUDED.kept, state = EXCLUDED.state, status = 'pending', version = i.version + 1,
    priority = EXCLUDED.priority,
    visits = '{}', attempts = 0, checkpoint = EXCLUDED.checkpoint, last_error_code = NULL,
    last_error = NULL, held_state = NULL, compensate_to = NULL, next_run_at = now(),
    state_entered_at = now(), run_started_at = now(), updated_at = now(),
    children_ended = 0, children_wait = NULL
WHERE i.status IN ('completed', 'failed', 'cancelled') AND NOT (EXCLUDED.kept AND i.status = 'completed')
RETURNING i.machine, i.key, i.version, i.priority;

-- name: wf_keep
-- A start with once=True found the key's run completed (started without
-- once, perhaps): mark it kept, so retention keeps what refuses the next start.
UPDATE {schema}.wf_instances SET kept = true
WHERE machine = $1 AND key = $2 AND status = 'completed' AND NOT kept;

-- name: wf_move
-- The guarded transition and its history row in one statement: only from the
-- version that was read and, for a visit, only while its delivery's lease
-- holds. No row back means a stale visit; the caller writes nothing else.
-- The run's priority comes back with the version: the next step is
-- published with it, without reading the row again.
WITH moved AS (
    UPDATE {schema}.wf_instances
    SET state = $3, status = $4, version = version + 1, visits = $5, attempts = $6,
        checkpoint = $7, last_error_code = $8, last_error = $9, held_state = $10,
        compensate_to = $11,
        next_run_at = CASE WHEN $12::float8 IS NULL THEN NULL
                           ELSE now() + $12::float8 * interval '1 second' END,
        state_entered_at = CASE WHEN $13::boolean THEN now() ELSE state_entered_at END,
        run_id = CASE WHEN $14::boolean THEN run_id + 1 ELSE run_id END,
        run_started_at = CASE WHEN $14::boolean THEN now() ELSE run_started_at END,
        updated_at = now(), children_wait = NULL
    WHERE machine = $1 AND key = $2 AND version = $15
      AND ($16::bigint IS NULL OR EXISTS (
            SELECT 1 FROM {schema}.deliveries d
            WHERE d.id = $16::bigint AND d.lease_token = $17::uuid AND d.status = 'processing'))
    RETURNING version, run_id, priority
), hist AS (
    INSERT INTO {schema}.wf_history (machine, key, run_id, version, state, visit, outcome, next_state,
                                     yielded, error_code, error, actor, reason, delivery_id, started_at,
                                     woken_by)
    SELECT $1, $2, moved.run_id, moved.version, $18, $19, $20, $3, $21, $22, $23, $24, $25, $26,
           COALESCE(to_timestamp($27::float8), now()), $28
    FROM moved
    RETURNING 1
)
SELECT version, priority, (SELECT count(*) FROM hist) AS written FROM moved;

-- name: wf_move_batch
-- wf_move for a whole batch of transitions that write nothing else, in one
-- statement (one round trip per batch, where one statement per transition
-- cost most of a visit): each row is guarded on its own version and lease;
-- the rows that moved get their history row and their next step event
-- (inserted, fanned out, NOTIFY once per type, as `publish` does), at the
-- run's priority read from the row it moves ($32: the seconds a priority
-- level is worth, for the deliveries' priority_wait). Returns the
-- input position and new version of each row that moved; a missing position
-- was refused.
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[],
                         $7::bytea[], $8::text[], $9::text[], $10::text[], $11::text[],
                         $12::float8[], $13::boolean[], $14::boolean[], $15::bigint[],
                         $16::bigint[], $17::uuid[], $18::text[], $19::int[], $20::text[],
                         $21::boolean[], $22::text[], $23::text[], $24::text[], $25::text[],
                         $26::bigint[], $27::float8[], $28::text[], $29::text[], $30::float8[])
        WITH ORDINALITY AS t(machine, key, state, status, visits, attempts, checkpoint, error_code,
                             error, held_state, compensate_to, next_run_in, entered, new_run,
                             expected, lease_id, lease_token, h_state, visit, outcome, yielded,
                             h_error_code, h_error, actor, reason, delivery_id, started_at, woken_by,
                             step, step_delay, ord)
), moved AS (
    UPDATE {schema}.wf_instances i
    SET state = t.state, status = t.status, version = i.version + 1, visits = t.visits,
        attempts = t.attempts, checkpoint = t.checkpoint, last_error_code = t.error_code,
        last_error = t.error, held_state = t.held_state, compensate_to = t.compensate_to,
        next_run_at = CASE WHEN t.next_run_in IS NULL THEN NULL
                           ELSE now() + t.next_run_in * interval '1 second' END,
        state_entered_at = CASE WHEN t.entered THEN now() ELSE i.state_entered_at END,
        run_id = CASE WHEN t.new_run THEN i.run_id + 1 ELSE i.run_id END,
        run_started_at = CASE WHEN t.new_run THEN now() ELSE i.run_started_at END,
        updated_at = now(), children_wait = NULL
    FROM input t
    WHERE i.machine = t.machine AND i.key = t.key AND i.version = t.expected
      AND (t.lease_id IS NULL OR EXISTS (
            SELECT 1 FROM {schema}.deliveries d
            WHERE d.id = t.lease_id AND d.lease_token = t.lease_token AND d.status = 'processing'))
    RETURNING t.ord, i.version, i.run_id, i.priority
), hist AS (
    INSERT INTO {schema}.wf_history (machine, key, run_id, version, state, visit, outcome,
                                     next_state, yielded, error_code, error, actor, reason,
                                     delivery_id, started_at, woken_by)
    SELECT t.machine, t.key, m.run_id, m.version, t.h_state, t.visit, t.outcome, t.state,
           t.yielded, t.h_error_code, t.h_error, t.actor, t.reason, t.delivery_id,
           COALESCE(to_timestamp(t.started_at), now()), t.woken_by
    FROM moved m JOIN input t ON t.ord = m.ord
    RETURNING 1
), step_input AS (
    -- Ids drawn in input order (over the sorted rows), as the publish draws them.
    SELECT nextval('{schema}.event_ids') AS id, x.*
    FROM (SELECT t.ord, 'wf.step.' || t.machine AS event_type,
                 'wf/' || t.machine || '/' || t.key || '/v' || m.version || '/' || t.step AS key,
                 convert_to(jsonb_build_object('key', t.key, 'version', m.version,
                                               'reason', t.step)::text, 'UTF8') AS payload,
                 t.machine || '/' || t.key AS ordering_key,
                 now() + t.step_delay * interval '1 second' AS deliver_at, m.priority
          FROM moved m JOIN input t ON t.ord = m.ord
          WHERE t.step IS NOT NULL
          ORDER BY t.ord) x
), step_keys AS (
    -- Dedup of step events by key, as a publish does (event_keys).
    INSERT INTO {schema}.event_keys (event_type, key, event_id)
    SELECT event_type, key, id FROM step_input ORDER BY ord
    ON CONFLICT (event_type, key) DO NOTHING
    RETURNING event_id
), step AS (
    INSERT INTO {schema}.events (id, event_type, key, payload, ordering_key, deliver_at, priority)
    SELECT id, event_type, key, payload, ordering_key, deliver_at, priority
    FROM step_input
    WHERE id IN (SELECT event_id FROM step_keys)
    ORDER BY ord
    RETURNING id, event_type, ordering_key, deliver_at, priority
), fanout AS (
    INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at, priority_wait)
    SELECT step.id, s.id, CASE WHEN s.ordered THEN step.ordering_key END, step.deliver_at,
           step.priority * $32::float8
    FROM step JOIN {schema}.subscriptions s
      ON s.event_type = step.event_type AND s.state <> 'removed'
), notified AS (
    SELECT pg_notify($31, x.event_type) FROM (SELECT DISTINCT event_type FROM step) x
)
SELECT m.ord, m.version, (SELECT count(*) FROM notified) AS notified,
       (SELECT count(*) FROM hist) AS written
FROM moved m;

-- name: wf_consume_signals
-- Signals read by the visit are consumed by its transition, never before.
UPDATE {schema}.wf_signals SET consumed_version = $3
WHERE machine = $1 AND key = $2 AND id = ANY($4::bigint[]) AND consumed_version IS NULL;

-- name: wf_signal_waiting
-- Is a signal of this run the state wakes on already here? Then its yield ends at once.
SELECT EXISTS (SELECT 1 FROM {schema}.wf_signals
               WHERE machine = $1 AND key = $2 AND run_id = $4 AND consumed_version IS NULL
                 AND name = ANY($3::text[]));

-- name: wf_effect_insert
INSERT INTO {schema}.wf_effects (machine, key, run_id, state, op_key, kind, ref, compensation)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- name: wf_effect_status
UPDATE {schema}.wf_effects SET status = $2 WHERE id = $1 AND status <> 'compensated';

-- name: wf_approval_request
INSERT INTO {schema}.wf_approvals (machine, key, run_id, state, input, input_hash, status, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, 'pending', now() + $7::float8 * interval '1 second');

-- name: wf_approval_update
-- Guarded by the status the visit saw (a decision that raced it wins); a
-- decision is used once: the transition that acts on it (uses it, expires or
-- supersedes it) stamps its version, and no later visit reads it again.
UPDATE {schema}.wf_approvals SET status = $3::text, consumed_version = $4::bigint
WHERE id = $1 AND status = $2 AND consumed_version IS NULL;

-- name: wf_lock
-- Signals and decisions lock the pointer first, so a transition committing
-- concurrently either sees their row or is seen by them. The priority is
-- the run's, for the step that wakes it.
SELECT state, status, version, run_id, priority FROM {schema}.wf_instances
WHERE machine = $1 AND key = $2 FOR UPDATE;

-- name: wf_hasten
-- A step due now pulls the instance's delayed steps (a tick waiting for its
-- poll) forward: the step subscription is FIFO per instance, so the earlier
-- tick is the head and would hold the wake-up back until its time.
UPDATE {schema}.deliveries d SET run_at = now(), updated_at = now()
FROM {schema}.subscriptions s, unnest($1::text[], $2::text[]) AS t(event_type, ordering_key)
WHERE s.event_type = t.event_type AND d.subscription_id = s.id AND d.ordering_key = t.ordering_key
  AND d.status = 'pending' AND d.run_at > now();

-- name: wf_signal_insert
-- For the live run read under wf_lock; a dedupe id is unique within its run.
INSERT INTO {schema}.wf_signals (machine, key, run_id, name, dedupe, payload)
VALUES ($1, $2, $6, $3, $4, $5)
ON CONFLICT (machine, key, run_id, name, dedupe) DO NOTHING
RETURNING id;

-- name: wf_decide
-- Single use: only a pending, unexpired approval can be decided, once.
UPDATE {schema}.wf_approvals
SET status = $2, decided_by = $3, decided_at = now(), reason = $4
WHERE id = $1 AND status = 'pending' AND expires_at > now()
RETURNING *;

-- name: wf_list
SELECT i.*, now() AS now, false AS has_signals FROM {schema}.wf_instances i
WHERE i.machine = $1 AND ($2::text IS NULL OR i.status = $2) AND ($3::text IS NULL OR i.state = $3)
ORDER BY i.key LIMIT $4;

-- name: wf_counts
SELECT state, status, count(*) AS n FROM {schema}.wf_instances WHERE machine = $1
GROUP BY state, status;

-- name: wf_counts_capped
-- As wf_counts, each group counted no further than $2 rows: the (status,
-- state) groups are found by skipping through wf_instances_status (one probe
-- per group, not a read of every instance of the machine), then each group's
-- rows are counted from that index up to the limit.
WITH RECURSIVE grp AS (
    (SELECT status, state FROM {schema}.wf_instances WHERE machine = $1
     ORDER BY status, state LIMIT 1)
    UNION ALL
    SELECT n.status, n.state FROM grp g CROSS JOIN LATERAL (
        SELECT i.status, i.state FROM {schema}.wf_instances i
        WHERE i.machine = $1 AND (i.status, i.state) > (g.status, g.state)
        ORDER BY i.status, i.state LIMIT 1
    ) n
)
SELECT g.state, g.status,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.wf_instances i
                              WHERE i.machine = $1 AND i.status = g.status AND i.state = g.state
                              LIMIT $2) c) AS n
FROM grp g;

-- name: wf_history
SELECT run_id, version, state, visit, outcome, next_state, yielded, error_code, error, actor,
       reason, delivery_id, started_at, at, woken_by
FROM {schema}.wf_history WHERE machine = $1 AND key = $2 ORDER BY version;

-- name: wf_signals
SELECT id, run_id, name, dedupe, payload, created_at, consumed_version FROM {schema}.wf_signals
WHERE machine = $1 AND key = $2 AND (NOT $3::boolean OR consumed_version IS NULL)
ORDER BY id;

-- name: wf_approvals
SELECT * FROM {schema}.wf_approvals WHERE machine = $1 AND key = $2 ORDER BY id;

-- name: wf_approval
SELECT * FROM {schema}.wf_approvals WHERE id = $1;

-- name: wf_effects
SELECT id, run_id, state, op_key, kind, ref, compensation, status FROM {schema}.wf_effects
WHERE machine = $1 AND key = $2 AND run_id = $3 ORDER BY id;

-- name: wf_sweep
-- Live instances overdue by more than the grace with no step pending or
-- processing: their tick was lost (a dead or cancelled step delivery).
SELECT i.key, i.version, i.priority FROM {schema}.wf_instances i
WHERE i.next_run_at < now() - $2::float8 * interval '1 second' AND i.machine = $1
  AND i.status IN ('pending', 'running', 'waiting', 'waiting_approval')
  AND NOT EXISTS (
        SELECT 1 FROM {schema}.deliveries d JOIN {schema}.subscriptions s ON s.id = d.subscription_id
        WHERE s.event_type = 'wf.step.' || i.machine AND d.ordering_key = i.machine || '/' || i.key
          AND d.status = 'pending')
  AND NOT EXISTS (
        SELECT 1 FROM {schema}.deliveries d JOIN {schema}.subscriptions s ON s.id = d.subscription_id
        WHERE s.event_type = 'wf.step.' || i.machine AND d.ordering_key = i.machine || '/' || i.key
          AND d.status = 'processing')
ORDER BY i.next_run_at LIMIT $3;

-- name: wf_definition_record
-- The table a worker starts with becomes the one in force (a known one keeps
-- when it was first seen).
INSERT INTO {schema}.wf_definitions (machine, def_hash, definition)
VALUES ($1, $2, $3::jsonb)
ON CONFLICT (machine, def_hash) DO UPDATE SET registered_at = now();

-- name: wf_definition
-- The table in force: the one recorded most recently.
SELECT machine, def_hash, definition, first_registered_at, registered_at
FROM {schema}.wf_definitions WHERE machine = $1
ORDER BY registered_at DESC, def_hash LIMIT 1;

-- name: wf_child_link
-- Child runs join the parent's run ($1, $2, $3) in the parent's transition,
-- in start order: for each ($4 machines, $5 keys) the run the start just
-- began ($6 true), or the live (or, with once, completed) one it left alone.
-- A run that already ended is linked as ended and counts at once; a link
-- made twice is one.
WITH linked AS (
    INSERT INTO {schema}.wf_children (parent_machine, parent_key, parent_run_id, machine, key, run_id,
                                      started, status, state, checkpoint, error_code, error, ended_at)
    SELECT $1, $2, $3, i.machine, i.key, i.run_id, t.started, e.status, e.state, e.checkpoint,
           e.last_error_code, e.last_error, CASE WHEN e.status IS NOT NULL THEN now() END
    FROM unnest($4::text[], $5::text[], $6::boolean[]) WITH ORDINALITY AS t(machine, key, started, ord)
    JOIN {schema}.wf_instances i ON i.machine = t.machine AND i.key = t.key
    LEFT JOIN {schema}.wf_instances e ON e.machine = i.machine AND e.key = i.key
                                     AND e.status IN ('completed', 'failed', 'cancelled')
    ORDER BY t.ord
    ON CONFLICT DO NOTHING
    RETURNING status
)
UPDATE {schema}.wf_instances
SET children_ended = children_ended + (SELECT count(*) FROM linked WHERE status IS NOT NULL)
WHERE machine = $1 AND key = $2 AND run_id = $3
  AND EXISTS (SELECT 1 FROM linked WHERE status IS NOT NULL);

-- name: wf_children_wait
-- The parent now waits on its children: the count it wakes at (-1: every
-- child of the run, counted now, the links of this transition included). Due
-- at once when that many have already ended; otherwise the child whose end
-- crosses it wakes the parent (wf_children_end), under this row's lock.
UPDATE {schema}.wf_instances i
SET children_wait = CASE WHEN $3::int >= 0 THEN $3::int ELSE
        (SELECT count(*) FROM {schema}.wf_children c
         WHERE c.parent_machine = i.machine AND c.parent_key = i.key AND c.parent_run_id = i.run_id)
    END
WHERE i.machine = $1 AND i.key = $2
RETURNING i.children_ended >= i.children_wait AS due;

-- name: wf_children_end
-- These instances ($1 machines, $2 keys) just entered an ended status: their
-- runs' links record the outcome, and each parent run's count moves on by how
-- many of its children ended here. The count moves under the parent's row
-- lock, so of concurrent ends exactly one sees it cross children_wait: that
-- parent, still waiting, is returned to be woken (once: old < wait <= new).
WITH ended AS (
    UPDATE {schema}.wf_children c
    SET status = i.status, state = i.state, checkpoint = i.checkpoint, error_code = i.last_error_code,
        error = i.last_error, ended_at = now()
    FROM unnest($1::text[], $2::text[]) AS t(machine, key)
    JOIN {schema}.wf_instances i ON i.machine = t.machine AND i.key = t.key
    WHERE c.machine = i.machine AND c.key = i.key AND c.run_id = i.run_id AND c.status IS NULL
      AND i.status IN ('completed', 'failed', 'cancelled')
    RETURNING c.parent_machine, c.parent_key, c.parent_run_id
), counted AS (
    SELECT parent_machine, parent_key, parent_run_id, count(*)::int AS n
    FROM ended GROUP BY parent_machine, parent_key, parent_run_id
), parents AS (
    UPDATE {schema}.wf_instances p SET children_ended = p.children_ended + counted.n
    FROM counted
    WHERE p.machine = counted.parent_machine AND p.key = counted.parent_key
      AND p.run_id = counted.parent_run_id
    RETURNING p.machine, p.key, p.version, p.priority, p.status, p.children_ended, p.children_wait,
              counted.n
)
SELECT machine, key, version, priority FROM parents
WHERE status = 'waiting' AND children_wait IS NOT NULL
  AND children_ended >= children_wait AND children_ended - n < children_wait
ORDER BY machine, key;

-- name: wf_cancel_children
-- A cancelled run cancels the live runs it started, and theirs, down the
-- tree, in the same transaction: each moves to CANCELLED under a new version
-- (fencing a visit in flight) with its history row naming the cancelled
-- ancestor ($4 actor, $5 reason). Returns the cancelled instances, whose
-- ends wf_children_end then records.
WITH RECURSIVE tree AS (
    SELECT c.machine, c.key, c.run_id FROM {schema}.wf_children c
    WHERE c.parent_machine = $1 AND c.parent_key = $2 AND c.parent_run_id = $3
      AND c.started AND c.status IS NULL
    UNION
    SELECT c.machine, c.key, c.run_id FROM {schema}.wf_children c
    JOIN tree t ON c.parent_machine = t.machine AND c.parent_key = t.key AND c.parent_run_id = t.run_id
    WHERE c.started AND c.status IS NULL
), live AS (
    SELECT i.machine, i.key, i.state, i.visits FROM {schema}.wf_instances i
    JOIN tree t ON i.machine = t.machine AND i.key = t.key AND i.run_id = t.run_id
    WHERE i.status IN ('pending', 'running', 'waiting', 'waiting_approval', 'paused', 'uncertain')
    ORDER BY i.machine, i.key
    FOR UPDATE OF i
), moved AS (
    UPDATE {schema}.wf_instances i
    SET state = 'CANCELLED', status = 'cancelled', version = i.version + 1, next_run_at = NULL,
        children_wait = NULL, state_entered_at = now(), updated_at = now()
    FROM live l WHERE i.machine = l.machine AND i.key = l.key
    RETURNING i.machine, i.key, i.run_id, i.version, l.state AS old_state, l.visits
), hist AS (
    INSERT INTO {schema}.wf_history (machine, key, run_id, version, state, visit, outcome, next_state,
                                     yielded, actor, reason, started_at)
    SELECT m.machine, m.key, m.run_id, m.version, m.old_state,
           COALESCE((m.visits::jsonb ->> m.old_state)::int, 0), 'cancel', 'CANCELLED', false, $4, $5, now()
    FROM moved m
    RETURNING 1
)
SELECT machine, key, (SELECT count(*) FROM hist) AS written FROM moved ORDER BY machine, key;
