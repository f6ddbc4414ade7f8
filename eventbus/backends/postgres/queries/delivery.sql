-- The hot path of the PostgreSQL backend (PgDeliveries): publish, register,
-- claim, settle, lease. {schema} is the validated, quoted schema.
-- Every status change is one statement guarded by the expected status and,
-- after a claim, by the lease token.

-- name: publish
-- One round trip for any number of events: insert the events (skipping
-- duplicate keys), fan out one delivery per subscription of each type, and
-- NOTIFY once per event type (PostgreSQL folds identical notifications of one
-- transaction into one). A removed subscription gets nothing; a paused one
-- keeps its backlog growing until it is resumed. Event ids, and delivery ids
-- with them, follow the input order, which ordered subscriptions keep per key.
-- Ids are drawn in input order before the insert and returned with the input
-- ordinal, so each result maps to its input by the ordinal, never by the order
-- rows come back in. A key is taken in event_keys (the events table is
-- partitioned by id and cannot hold a unique (type, key) index); an event
-- whose key was taken is not inserted. $10, when not NULL, is the lock_timeout of this statement's
-- transaction (the held connection's bound, see HELD_LOCK_WAIT_MS), set before
-- the first row is inserted: once, by the InitPlan of the insert's condition.
-- $11: each event's version. $12: each event's priority; $13 the seconds of
-- waiting a priority level is worth (the deliveries' priority_wait). $14: the
-- bus takes the append-only hot path (see _ring_route: which deliveries go to
-- the ring instead of deliveries).
WITH input AS (
    SELECT nextval('{schema}.event_ids') AS id, t.*
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::float8[],
                $6::bigint[], $7::bigint[], $8::text[], $11::int[], $12::smallint[])
        WITH ORDINALITY AS t(event_type, key, payload, headers, delay_seconds,
                             correlation_id, causation_id, ordering_key, version, priority, ord)
    ORDER BY t.ord
), keys AS (
    -- Dedup: a key is taken by the first event of this batch that names it,
    -- unless an earlier publish holds it (a concurrent one waits here, on the
    -- key's index entry, for that publish to end).
    INSERT INTO {schema}.event_keys (event_type, key, event_id)
    SELECT event_type, key, id FROM input
    WHERE key IS NOT NULL
      AND (SELECT CASE WHEN $10::text IS NULL THEN true
                       ELSE set_config('lock_timeout', $10::text, true) IS NOT NULL END)
    ORDER BY ord
    ON CONFLICT (event_type, key) DO NOTHING
    RETURNING event_id
), ins AS (
    INSERT INTO {schema}.events (id, event_type, key, payload, headers, correlation_id,
                                 causation_id, ordering_key, deliver_at, version, priority)
    SELECT id, event_type, key, payload, headers::jsonb, correlation_id, causation_id,
           ordering_key, now() + delay_seconds * interval '1 second', version, priority
    FROM input
    WHERE (SELECT CASE WHEN $10::text IS NULL THEN true
                       ELSE set_config('lock_timeout', $10::text, true) IS NOT NULL END)
      AND (key IS NULL OR id IN (SELECT event_id FROM keys))
    ORDER BY ord
    RETURNING id, event_type, key, ordering_key, deliver_at, priority
), fanout AS (
    INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at, priority_wait)
    SELECT ins.id, s.id, CASE WHEN s.ordered THEN ins.ordering_key END, ins.deliver_at,
           ins.priority * $13::float8
    FROM ins JOIN {schema}.subscriptions s
      ON s.event_type = ins.event_type AND s.state <> 'removed'
    WHERE NOT ($14::bool AND {_ring_route})
    ORDER BY ins.id  -- delivery ids follow event order (the join's order reverses a batch)
), ringed AS (
    INSERT INTO {schema}.ring_ready (slot, delivery_id, subscription_id, event_id)
    SELECT {_ring_slot}, nextval('{schema}.deliveries_id_seq'), s.id, ins.id
    FROM ins JOIN {schema}.subscriptions s
      ON s.event_type = ins.event_type AND s.state <> 'removed'
    WHERE $14::bool AND {_ring_route}
    ORDER BY ins.id
), notified AS (
    SELECT pg_notify($9, t.event_type) FROM (SELECT DISTINCT event_type FROM ins) t
)
SELECT ins.id, input.ord, (SELECT count(*) FROM notified) AS notified
FROM ins JOIN input ON input.id = ins.id;

-- name: publish_one
-- The publish of a single event (the common call of a request handler): the
-- same insert, fan-out and NOTIFY as `publish`, without the arrays, the input
-- ordinals and the join that map a batch back to its inputs. A keyed event
-- takes its key in event_keys first, under the id it is then inserted with;
-- an event without a key draws its id in the insert. About half the server
-- time of `publish` for one event. No row back: the key was taken. $10 as in
-- `publish` (the CASE sets it before the row is inserted); $11 the version;
-- $12 the priority and $13 the seconds a priority level is worth; $14 as in
-- `publish`.
WITH keys AS (
    INSERT INTO {schema}.event_keys (event_type, key, event_id)
    SELECT $1::text, $2::text, nextval('{schema}.event_ids')
    WHERE $2::text IS NOT NULL
      AND CASE WHEN $10::text IS NULL THEN true
               ELSE set_config('lock_timeout', $10::text, true) IS NOT NULL END
    ON CONFLICT (event_type, key) DO NOTHING
    RETURNING event_id
), ins AS (
    INSERT INTO {schema}.events (id, event_type, key, payload, headers, correlation_id,
                                 causation_id, ordering_key, deliver_at, version, priority)
    SELECT coalesce((SELECT event_id FROM keys), nextval('{schema}.event_ids')),
           $1::text, $2::text, $3::bytea, $4::jsonb, $6::bigint, $7::bigint, $8::text,
           now() + $5::float8 * interval '1 second', $11::int, $12::smallint
    WHERE CASE WHEN $10::text IS NULL THEN true
               ELSE set_config('lock_timeout', $10::text, true) IS NOT NULL END
      AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM keys))
    RETURNING id, event_type, ordering_key, deliver_at, priority
), fanout AS (
    INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at, priority_wait)
    SELECT ins.id, s.id, CASE WHEN s.ordered THEN ins.ordering_key END, ins.deliver_at,
           ins.priority * $13::float8
    FROM ins JOIN {schema}.subscriptions s
      ON s.event_type = ins.event_type AND s.state <> 'removed'
    WHERE NOT ($14::bool AND {_ring_route})
), ringed AS (
    INSERT INTO {schema}.ring_ready (slot, delivery_id, subscription_id, event_id)
    SELECT {_ring_slot}, nextval('{schema}.deliveries_id_seq'), s.id, ins.id
    FROM ins JOIN {schema}.subscriptions s
      ON s.event_type = ins.event_type AND s.state <> 'removed'
    WHERE $14::bool AND {_ring_route}
)
SELECT id, pg_notify($9, event_type) FROM ins;

-- name: _ring_route
-- With the append-only hot path (PgRing), a delivery of the event ins to the
-- subscription s starts in the ring when it is an ordinary first run: an
-- unordered subscription with no backfill owed (whose deliveries must meet
-- the backfill's in one table, under its unique (event, subscription) pair),
-- due now, of priority 0 (the ring is claimed in publish order).
(NOT s.ordered AND ins.deliver_at <= now() AND ins.priority = 0
 AND NOT EXISTS (SELECT 1 FROM {schema}.subscription_backfills b WHERE b.subscription_id = s.id))

-- name: _ring_slot
-- The ring's current slot: the newest generation's.
(SELECT g.slot FROM {schema}.ring_log g WHERE g.kind = 'open' ORDER BY g.gen DESC LIMIT 1)

-- name: kept_keys
-- The events that took these keys for good (publishes with once=True); the
-- events themselves may have been pruned since.
SELECT k.event_type, k.key, k.event_id
FROM {schema}.kept_keys k
JOIN unnest($1::text[], $2::text[]) AS t(event_type, key)
  ON k.event_type = t.event_type AND k.key = t.key;

-- name: keep_keys
-- Keep keys for good, in the transaction of their events. A concurrent
-- publish of the same key waited on event_keys' primary key and maps to the
-- same event, so a conflict here is the same row.
INSERT INTO {schema}.kept_keys (event_type, key, event_id)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
ON CONFLICT (event_type, key) DO NOTHING;

-- name: existing_ids
-- Ids of events whose keys were taken by an earlier publish.
SELECT k.event_id AS id, k.event_type, k.key
FROM {schema}.event_keys k
JOIN unnest($1::text[], $2::text[]) AS t(event_type, key)
  ON k.event_type = t.event_type AND k.key = t.key;

-- name: register
-- Upsert by name; a name already bound to another event type returns no row.
-- The state (paused, removed) is the operator's and is left alone; $6 says a
-- worker serving the subscription registers it.
-- was_ordered is the mode before this upsert (NULL for a new subscription), so
-- a switch between ordered and unordered can rekey the pending deliveries.
WITH old AS (SELECT ordered FROM {schema}.subscriptions WHERE name = $1)
INSERT INTO {schema}.subscriptions (name, event_type, max_attempts, lease_seconds, ordered,
                                    worker_seen_at)
VALUES ($1, $2, $3, $4, $5, CASE WHEN $6::bool THEN now() END)
ON CONFLICT (name) DO UPDATE
    SET max_attempts = EXCLUDED.max_attempts, lease_seconds = EXCLUDED.lease_seconds,
        ordered = EXCLUDED.ordered, last_seen_at = now(),
        worker_seen_at = coalesce(EXCLUDED.worker_seen_at, {schema}.subscriptions.worker_seen_at)
    WHERE {schema}.subscriptions.event_type = EXCLUDED.event_type
RETURNING id, (xmax = 0) AS created, state, (SELECT ordered FROM old) AS was_ordered;

-- name: rekey
-- A subscription switched between ordered and unordered: its deliveries that
-- may still run (pending, and dead ones a replay can revive) take the new
-- mode's ordering key, the event's key when ordered and none otherwise.
-- Processing rows finish as they were claimed.
UPDATE {schema}.deliveries d
SET ordering_key = CASE WHEN $2 THEN e.ordering_key END
FROM {schema}.events e
WHERE d.subscription_id = $1 AND d.status IN ('pending', 'dead') AND e.id = d.event_id
  AND d.ordering_key IS DISTINCT FROM (CASE WHEN $2 THEN e.ordering_key END);

-- name: backfill_guard
-- Taken (shared) in a transaction before its first backfill statement and held
-- to its end: a prune batch deletes events only while it holds this lock
-- alone (prune_backfill_guard), so it never deletes an event whose backfilled
-- deliveries it cannot see yet, and a backfill that waited for a prune batch
-- reads the log after that batch's deletions (a new statement, a new snapshot).
SELECT pg_advisory_xact_lock_shared(hashtext($1 || ':backfill'));

-- name: backfill
-- A new subscription reads the retained log from the start. Idempotent (the
-- unique (event, subscription) pair), so it may run any number of times.
-- $2: the seconds a priority level is worth (the waits follow each event's priority).
INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at, priority_wait)
SELECT e.id, s.id, CASE WHEN s.ordered THEN e.ordering_key END, e.deliver_at,
       e.priority * $2::float8
FROM {schema}.subscriptions s
JOIN {schema}.events e ON e.event_type = s.event_type
WHERE s.id = $1 AND s.state <> 'removed'
ORDER BY e.id
ON CONFLICT (event_id, subscription_id) DO NOTHING;

-- name: backfill_owed
-- Recorded in the registering transaction: it commits with the subscription.
INSERT INTO {schema}.subscription_backfills (subscription_id, registered_xid)
VALUES ($1, pg_current_xact_id())
ON CONFLICT (subscription_id) DO NOTHING;

-- name: backfills_exist
-- Any owed backfill (of the subscriptions $1, or of any when NULL)?
SELECT EXISTS (SELECT 1 FROM {schema}.subscription_backfills
               WHERE $1::int[] IS NULL OR subscription_id = ANY($1::int[]));

-- name: backfill_sessions
-- For owed backfills this session can see (their subscription committed
-- before this statement began): the transactions of this database that may
-- have published without seeing it. Such a transaction is, at this moment,
-- either still in the statement whose snapshot predates the registration (its
-- oldest snapshot is then not newer than the registering transaction) or past
-- it with the xid it wrote under, whatever its isolation level. Vacuum never
-- publishes. Virtual transaction ids name a transaction, not a session; every
-- transaction holds its own until it ends. The xids (with those of prepared
-- transactions) cover one that prepares later. pg_stat_activity shows datid,
-- backend_xid and backend_xmin of every role's sessions, so no privilege is
-- needed.
UPDATE {schema}.subscription_backfills b
SET open_vxids = ARRAY(
    SELECT l.virtualxid
    FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
    WHERE l.locktype = 'virtualxid' AND l.granted AND a.pid <> pg_backend_pid()
      AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
      AND (a.backend_xid IS NOT NULL
           OR age(a.backend_xmin) >= age(b.registered_xid::xid))),
    open_xids = ARRAY(
    SELECT a.backend_xid::text FROM pg_stat_activity a
    WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND a.backend_xid IS NOT NULL
    UNION ALL
    SELECT p.transaction::text FROM pg_prepared_xacts p WHERE p.database = current_database())
WHERE b.open_vxids IS NULL;

-- name: backfills_settled
-- Owed backfills whose overlapping transactions have all ended: no open_vxids
-- is held any more, and none of open_xids waits as a prepared transaction (a
-- transaction that prepares releases its vxid but keeps its xid). A
-- transaction's locks are released only after its commit became visible, so the next backfill sees what it published.
SELECT b.subscription_id FROM {schema}.subscription_backfills b
WHERE b.open_vxids IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.locktype = 'virtualxid' AND l.granted
                    AND l.virtualxid = ANY(b.open_vxids))
  AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts p
                  WHERE p.transaction::text = ANY(b.open_xids))
ORDER BY 1;

-- name: backfill_settle
-- Guarded: of processes finishing one backfill at once, one deletes the row
-- and runs the last backfill in the same transaction.
DELETE FROM {schema}.subscription_backfills WHERE subscription_id = $1 RETURNING subscription_id;

-- name: _event_of_claim
-- The event of a claimed row (c), read by a probe of the events' primary key,
-- one per row: the `OFFSET 0` keeps PostgreSQL from planning it as a join. An
-- ANALYZE that ran while every event it sampled was uncommitted (a large
-- publish in flight, or one rolled back) records a chunk's pages and no rows;
-- planned as a join on that estimate of one event, a claim read the whole
-- chunk (hashed it, 17 ms per claim of 100 at 20,000 events; or scanned it
-- once per claimed row on the append-only path, 690 ms).
(SELECT event_type, payload, headers, key, correlation_id, created_at, causation_id, version, priority
 FROM {schema}.events WHERE id = c.event_id OFFSET 0)

-- name: claim
-- Lock up to $2 runnable rows with SKIP LOCKED, take them under a lease and a
-- fresh token, and return them with their payload. The rows are read in
-- their place order (run_at plus their priority's wait): one range of
-- deliveries_claim_order, from the start up to now() + $6 (the wait of the
-- lowest priority), past which no row can be due. The "due now" test is on
-- the index entry's run_at: rows sorted ahead of their time (delayed or
-- retried with a high priority) are passed over in the index, never read.
-- Only an active subscription is claimed from (a one-row check, evaluated once).
-- `id = ANY(ARRAY(...))` keeps the update on the primary key whatever the
-- planner thinks of the table's size. An unordered claim clears the ordering
-- key (already NULL unless the subscription was ordered when the row was
-- fanned out), so it can never trip deliveries_one_per_key.
WITH claimed AS (
    UPDATE {schema}.deliveries d
    SET status = 'processing', attempts = d.attempts + 1,
        lease_until = now() + $3 * interval '1 second', lease_token = $4, worker_id = $5,
        ordering_key = NULL, updated_at = now()
    WHERE d.id = ANY(ARRAY(
        SELECT id FROM {schema}.deliveries
        WHERE subscription_id = $1 AND status = 'pending' AND run_at <= now()
          AND {schema}.claim_place(run_at, priority_wait) <= now() + $6 * interval '1 second'
          AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active')
        ORDER BY {schema}.claim_place(run_at, priority_wait), run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.event_id, d.attempts, d.ordering_key, d.run_at,
              {schema}.claim_place(d.run_at, d.priority_wait) AS place
)
SELECT c.id, c.event_id, c.attempts, e.event_type, e.payload, e.headers::text, e.key,
       e.correlation_id, c.ordering_key, e.created_at, c.run_at, e.causation_id,
       e.version, e.priority, c.place
FROM claimed c CROSS JOIN LATERAL {_event_of_claim} AS e
ORDER BY c.place, c.run_at, c.id;

-- name: claim_after
-- As claim, starting after the last row this worker claimed ($7, $8, $9: its
-- place, run_at and id). While a
-- long transaction holds back the xmin horizon, entries of rows that are no
-- longer pending stay in deliveries_claim_order; a claim from the start would walk
-- all of them every time. The worker falls back to claim when this comes up
-- short, so a row that became pending behind the cursor is still found.
WITH claimed AS (
    UPDATE {schema}.deliveries d
    SET status = 'processing', attempts = d.attempts + 1,
        lease_until = now() + $3 * interval '1 second', lease_token = $4, worker_id = $5,
        ordering_key = NULL, updated_at = now()
    WHERE d.id = ANY(ARRAY(
        SELECT id FROM {schema}.deliveries
        WHERE subscription_id = $1 AND status = 'pending' AND run_at <= now()
          AND {schema}.claim_place(run_at, priority_wait) <= now() + $6 * interval '1 second'
          AND ({schema}.claim_place(run_at, priority_wait), run_at, id)
              > ($7::timestamptz, $8::timestamptz, $9::bigint)
          AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active')
        ORDER BY {schema}.claim_place(run_at, priority_wait), run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.event_id, d.attempts, d.ordering_key, d.run_at,
              {schema}.claim_place(d.run_at, d.priority_wait) AS place
)
SELECT c.id, c.event_id, c.attempts, e.event_type, e.payload, e.headers::text, e.key,
       e.correlation_id, c.ordering_key, e.created_at, c.run_at, e.causation_id,
       e.version, e.priority, c.place
FROM claimed c CROSS JOIN LATERAL {_event_of_claim} AS e
ORDER BY c.place, c.run_at, c.id;

-- name: claim_ordered
-- As claim, for subscriptions that are FIFO per key whatever the priorities:
-- a keyed row is taken only as the head of its key (no earlier delivery of the
-- key, by event id, is pending or processing) and only while no delivery of
-- the key is processing; a head waiting for its retry time blocks its key,
-- and a follower of a higher priority waits for its head. The checks read the
-- statement's snapshot, so a head that another worker is claiming right now
-- is still pending there and keeps its followers out, while SKIP LOCKED passes
-- over the head itself. The walk in deliveries_claim_order passes over the
-- followers of busy keys: the processing check comes first because PostgreSQL
-- hashes it once per statement (deliveries_one_per_key), so a follower of a
-- running head costs no probe; the earlier-row check is one probe of
-- deliveries_key_order. deliveries_one_per_key stays the rule: a head
-- revived by a replay while a later row of its key was being claimed makes
-- one of the two claims fail, and that worker waits for the next wake-up.
WITH claimed AS (
    UPDATE {schema}.deliveries d
    SET status = 'processing', attempts = d.attempts + 1,
        lease_until = now() + $3 * interval '1 second', lease_token = $4, worker_id = $5,
        updated_at = now()
    WHERE d.id = ANY(ARRAY(
        SELECT c.id FROM {schema}.deliveries c
        WHERE c.subscription_id = $1 AND c.status = 'pending' AND c.run_at <= now()
          AND {schema}.claim_place(c.run_at, c.priority_wait) <= now() + $6 * interval '1 second'
          AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active')
          AND {_claimable}
        ORDER BY {schema}.claim_place(c.run_at, c.priority_wait), c.run_at, c.id
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.event_id, d.attempts, d.ordering_key, d.run_at,
              {schema}.claim_place(d.run_at, d.priority_wait) AS place
)
SELECT c.id, c.event_id, c.attempts, e.event_type, e.payload, e.headers::text, e.key,
       e.correlation_id, c.ordering_key, e.created_at, c.run_at, e.causation_id,
       e.version, e.priority, c.place
FROM claimed c CROSS JOIN LATERAL {_event_of_claim} AS e
ORDER BY c.place, c.run_at, c.id;

-- name: complete
-- One statement per lease token (a claim batch): the primary key is the access
-- path (`id = ANY`) whatever the statistics say, with no join to plan badly.
-- The caller inserts follow-ups only for the (id, token) pairs returned.
UPDATE {schema}.deliveries
SET status = 'completed', lease_until = NULL, lease_token = NULL, updated_at = now()
WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_token = $2
RETURNING id;

-- name: transaction_idle_limit
-- A transactional handler's transaction may wait between its statements for
-- as long as the handler may run: the dead-client guard of the session
-- (idle_in_transaction_session_timeout) is raised for this transaction alone.
SELECT set_config('idle_in_transaction_session_timeout', $1, true);

-- name: fail
-- Retry (pending at now() + delay) or dead, and append the attempt to history;
-- peers are notified of retries, as of a publish. Fenced by (id, token): a
-- stale failure of a delivery whose fresh run fails in the same batch neither
-- changes the row nor adds an attempt.
WITH t AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::bool[], $4::float8[], $5::text[],
                         $6::text[], $7::text[], $8::float8[], $9::uuid[])
        AS t(id, token, dead, delay_seconds, error_type, message, traceback,
             duration_seconds, worker_id)
), failed AS (
    UPDATE {schema}.deliveries d
    SET status = CASE WHEN t.dead THEN 'dead' ELSE 'pending' END,
        run_at = CASE WHEN t.dead THEN d.run_at
                      ELSE now() + t.delay_seconds * interval '1 second' END,
        last_error = t.error_type || ': ' || t.message,
        lease_until = NULL, lease_token = NULL, updated_at = now()
    FROM t
    WHERE d.id = ANY($1::bigint[]) AND d.id = t.id
      AND d.status = 'processing' AND d.lease_token = t.token
    RETURNING d.id, d.attempts, d.subscription_id, d.status, t.token
), history AS (
    INSERT INTO {schema}.delivery_attempts
        (delivery_id, attempt, error_type, message, traceback, duration_seconds, worker_id)
    SELECT failed.id, failed.attempts, t.error_type, t.message, t.traceback,
           t.duration_seconds, t.worker_id
    FROM failed JOIN t ON t.id = failed.id AND t.token = failed.token
), notified AS (
    -- Idle peers learn of the retry and plan their next claim from its run_at.
    SELECT pg_notify($10, s.event_type) FROM {schema}.subscriptions s
    WHERE s.id IN (SELECT subscription_id FROM failed WHERE status = 'pending')
)
SELECT id, token::text, (SELECT count(*) FROM notified) AS notified FROM failed;

-- name: release
-- Hand back deliveries this worker claimed but will not finish, without
-- counting the attempt. run_at is kept (it was due when claimed), so a
-- delivery keeps its place in the queue; peers are notified, as by a publish.
WITH released AS (
    UPDATE {schema}.deliveries
    SET status = 'pending', attempts = attempts - 1, lease_until = NULL, lease_token = NULL,
        updated_at = now()
    WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_token = $2
    RETURNING subscription_id
), notified AS (
    SELECT pg_notify($3, s.event_type) FROM {schema}.subscriptions s
    WHERE s.id IN (SELECT subscription_id FROM released)
)
SELECT (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM notified) AS notified;

-- name: extend
-- Renew the leases still held under the token. A row another transaction holds
-- (this worker's result write, most often) is skipped rather than waited for:
-- waiting let a renewal and a completion of the same batch lock rows in
-- opposite orders and deadlock. A skipped row still counts as held when it is
-- still processing under the token (as this statement's snapshot sees it); it
-- is renewed next time if its holder rolls back.
WITH locked AS (
    SELECT id FROM {schema}.deliveries
    WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_token = $2
    FOR UPDATE SKIP LOCKED
), renewed AS (
    UPDATE {schema}.deliveries d
    SET lease_until = now() + $3 * interval '1 second'
    FROM locked WHERE d.id = locked.id
    RETURNING d.id
)
SELECT id FROM {schema}.deliveries
WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_token = $2;

-- name: recover_expired
-- Deliveries whose worker stopped renewing the lease: the attempt counts; they
-- go back to pending, or dead when out of attempts. run_at is kept (it was due
-- when claimed), so a delivery keeps its place; peers are notified of the
-- pending ones, as by a publish. $3, when given, is where the previous sweep
-- of this process left off (see PostgresBackend.recover_expired): the walk of
-- deliveries_lease_until starts there, past the entries of finished rows that
-- a held xmin horizon keeps in the index. swept_at is where this one ends:
-- now, or the earliest expired lease it had to skip because another session
-- held its row, so such a row is looked at again by the next sweep rather
-- than by the next sweep from the start.
WITH expired AS (
    SELECT id FROM {schema}.deliveries
    WHERE status = 'processing' AND lease_until < now()
      AND lease_until >= coalesce($3::timestamptz, '-infinity')
    ORDER BY lease_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), recovered AS (
    UPDATE {schema}.deliveries d
    SET status = CASE WHEN d.attempts >= s.max_attempts THEN 'dead' ELSE 'pending' END,
        last_error = 'LeaseExpired: the worker stopped renewing its lease',
        lease_until = NULL, lease_token = NULL, updated_at = now()
    FROM expired, {schema}.subscriptions s
    WHERE d.id = expired.id AND s.id = d.subscription_id
      AND d.status = 'processing' AND d.lease_until < now()
    RETURNING d.id, d.attempts, d.worker_id, d.subscription_id, d.status
), history AS (
    INSERT INTO {schema}.delivery_attempts (delivery_id, attempt, error_type, message, worker_id)
    SELECT id, attempts, 'LeaseExpired', 'the worker stopped renewing its lease', worker_id
    FROM recovered
), notified AS (
    SELECT pg_notify($2, s.event_type) FROM {schema}.subscriptions s
    WHERE s.id IN (SELECT subscription_id FROM recovered WHERE status = 'pending')
), skipped AS (
    -- expired in the window but locked by another session (a peer recovering
    -- or completing them, or a dead client's transaction the server has not
    -- ended yet): the next sweep must start no later than they do
    SELECT min(lease_until) AS at FROM {schema}.deliveries
    WHERE status = 'processing' AND lease_until < now()
      AND lease_until >= coalesce($3::timestamptz, '-infinity')
      AND id NOT IN (SELECT id FROM expired)
)
SELECT (SELECT count(*) FROM recovered) AS recovered, (SELECT count(*) FROM notified) AS notified,
       (SELECT count(*) FROM expired) AS expired,
       least(now(), (SELECT at FROM skipped)) AS swept_at;

-- name: _claimable
-- A pending row c of subscription $1 that a claim may take when due: unkeyed,
-- or the head of its key with nothing of the key processing (claim_ordered
-- and next_run_in).
(c.ordering_key IS NULL OR (
    NOT EXISTS (
        SELECT 1 FROM {schema}.deliveries p
        WHERE p.subscription_id = $1 AND p.ordering_key = c.ordering_key
          AND p.status = 'processing' AND p.ordering_key IS NOT NULL)
    AND NOT EXISTS (
        SELECT 1 FROM {schema}.deliveries p
        WHERE p.subscription_id = $1 AND p.ordering_key = c.ordering_key
          AND p.status IN ('pending', 'processing') AND p.event_id < c.event_id)))

-- name: next_run_in
-- When the subscription's next claimable delivery is due: the earliest run_at
-- of its claimable pending rows. No row when every key is busy: the worker
-- then waits for a completion or a wake-up instead of claiming again at once.
-- None for a paused or removed subscription: nothing of it will be claimable.
-- A wait is never below 0, so a row's place is never before its run_at, and
-- equal to it for a wait of 0: the earliest run_at is the lesser of the first
-- place of a claimable row (deliveries_claim_order) and the earliest run_at of
-- a claimable row with a wait (deliveries_pending_prioritised). Each is the
-- first entry of an index walk; neither reads the backlog. $2, when given, is
-- the run_at of the worker's claim cursor: both walks start there, past the
-- entries of rows already taken (see claim_after), and what is behind it is
-- left to the worker's next claim from the start. A row either walk skips has
-- a run_at (at most its place) before the cursor's, so it is due already and
-- a claim finds it.
SELECT extract(epoch FROM least(
    (SELECT {schema}.claim_place(c.run_at, c.priority_wait) FROM {schema}.deliveries c
     WHERE c.subscription_id = $1 AND c.status = 'pending'
       AND {schema}.claim_place(c.run_at, c.priority_wait) >= coalesce($2::timestamptz, '-infinity')
       AND {_claimable}
     ORDER BY {schema}.claim_place(c.run_at, c.priority_wait), c.run_at, c.id
     LIMIT 1),
    (SELECT c.run_at FROM {schema}.deliveries c
     WHERE c.subscription_id = $1 AND c.status = 'pending' AND c.priority_wait > 0
       AND c.run_at >= coalesce($2::timestamptz, '-infinity')
       AND {_claimable}
     ORDER BY c.run_at
     LIMIT 1)) - now())::float8
WHERE EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active');

-- name: worker_beat
INSERT INTO {schema}.workers (id, hostname, pid, listener_ok, listener_reconnects)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), listener_ok = EXCLUDED.listener_ok,
    listener_reconnects = EXCLUDED.listener_reconnects;

-- name: subscriptions_seen
-- The subscriptions a live worker serves were seen by a worker now.
UPDATE {schema}.subscriptions SET worker_seen_at = now() WHERE id = ANY($1::int[]);

-- name: worker_gone
DELETE FROM {schema}.workers WHERE id = $1 OR heartbeat_at < now() - interval '1 day';

-- name: lost_worker_candidates
-- Workers holding processing deliveries that are silent for $1 seconds by the
-- database's clock, or reported from host $2 (whose process ids the caller
-- can check): a short read of the small workers table and a partial index.
SELECT w.id::text AS id, w.hostname, w.pid, extract(epoch FROM now() - w.heartbeat_at)::float8 AS silent
FROM {schema}.workers w
WHERE (w.heartbeat_at < now() - make_interval(secs => $1) OR w.hostname = $2)
  AND EXISTS (SELECT 1 FROM {schema}.deliveries d WHERE d.status = 'processing' AND d.worker_id = w.id);

-- name: rescue
-- The processing deliveries of lost workers $1, fenced as recover_expired is:
-- the attempt counts; back to pending, or dead when out of attempts; peers
-- are notified; each worker's row counts what was taken from it.
WITH taken AS (
    SELECT id FROM {schema}.deliveries
    WHERE status = 'processing' AND worker_id = ANY($1::uuid[])
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE {schema}.deliveries d
    SET status = CASE WHEN d.attempts >= s.max_attempts THEN 'dead' ELSE 'pending' END,
        last_error = 'WorkerLost: its worker stopped reporting; taken back before its lease ran out',
        lease_until = NULL, lease_token = NULL, updated_at = now()
    FROM taken, {schema}.subscriptions s
    WHERE d.id = taken.id AND s.id = d.subscription_id AND d.status = 'processing'
    RETURNING d.id, d.attempts, d.worker_id, d.subscription_id, d.status
), history AS (
    INSERT INTO {schema}.delivery_attempts (delivery_id, attempt, error_type, message, worker_id)
    SELECT id, attempts, 'WorkerLost', 'its worker stopped reporting; taken back before its lease ran out',
           worker_id
    FROM rescued
), counted AS (
    UPDATE {schema}.workers w SET rescued = w.rescued + c.n
    FROM (SELECT worker_id, count(*) AS n FROM rescued GROUP BY worker_id) c
    WHERE w.id = c.worker_id
), notified AS (
    SELECT pg_notify($3, s.event_type) FROM {schema}.subscriptions s
    WHERE s.id IN (SELECT subscription_id FROM rescued WHERE status = 'pending')
)
SELECT worker_id::text AS worker_id, count(*)::int AS n, (SELECT count(*) FROM notified) AS notified
FROM rescued GROUP BY worker_id;
