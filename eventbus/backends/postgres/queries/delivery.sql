-- Queries of the PostgreSQL backend. {schema} is the validated, quoted schema.
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
-- rows come back in.
WITH input AS (
    SELECT nextval((SELECT pg_get_serial_sequence('{schema}.events', 'id'))::regclass) AS id, t.*
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::float8[],
                $6::bigint[], $7::bigint[], $8::text[])
        WITH ORDINALITY AS t(event_type, key, payload, headers, delay_seconds,
                             correlation_id, causation_id, ordering_key, ord)
    ORDER BY t.ord
), ins AS (
    INSERT INTO {schema}.events (id, event_type, key, payload, headers, correlation_id,
                                 causation_id, ordering_key, deliver_at)
    OVERRIDING SYSTEM VALUE
    SELECT id, event_type, key, payload, headers::jsonb, correlation_id, causation_id,
           ordering_key, now() + delay_seconds * interval '1 second'
    FROM input ORDER BY ord
    ON CONFLICT (event_type, key) DO NOTHING
    RETURNING id, event_type, key, ordering_key, deliver_at
), fanout AS (
    INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at)
    SELECT ins.id, s.id, CASE WHEN s.ordered THEN ins.ordering_key END, ins.deliver_at
    FROM ins JOIN {schema}.subscriptions s
      ON s.event_type = ins.event_type AND s.state <> 'removed'
    ORDER BY ins.id  -- delivery ids follow event order (the join's order reverses a batch)
), notified AS (
    SELECT pg_notify($9, t.event_type) FROM (SELECT DISTINCT event_type FROM ins) t
)
SELECT ins.id, input.ord, (SELECT count(*) FROM notified) AS notified
FROM ins JOIN input ON input.id = ins.id;

-- name: publish_one
-- The publish of a single event (the common call of a request handler): the
-- same insert, fan-out and NOTIFY as `publish`, without the arrays, the input
-- ordinals and the join that map a batch back to its inputs. One row needs no
-- ordering, so its id comes from the identity default. About half the server
-- time of `publish` for one event. No row back: the key was taken.
WITH ins AS (
    INSERT INTO {schema}.events (event_type, key, payload, headers, correlation_id,
                                 causation_id, ordering_key, deliver_at)
    VALUES ($1, $2, $3, $4::jsonb, $6, $7, $8, now() + $5::float8 * interval '1 second')
    ON CONFLICT (event_type, key) DO NOTHING
    RETURNING id, event_type, ordering_key, deliver_at
), fanout AS (
    INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at)
    SELECT ins.id, s.id, CASE WHEN s.ordered THEN ins.ordering_key END, ins.deliver_at
    FROM ins JOIN {schema}.subscriptions s
      ON s.event_type = ins.event_type AND s.state <> 'removed'
)
SELECT id, pg_notify($9, event_type) FROM ins;

-- name: existing_ids
-- Ids of events whose keys were taken by an earlier publish.
SELECT e.id, e.event_type, e.key
FROM {schema}.events e
JOIN unnest($1::text[], $2::text[]) AS t(event_type, key)
  ON e.event_type = t.event_type AND e.key = t.key;

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

-- name: backfill
-- A new subscription reads the retained log from the start. Idempotent (the
-- unique (event, subscription) pair), so it may run any number of times.
INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at)
SELECT e.id, s.id, CASE WHEN s.ordered THEN e.ordering_key END, e.deliver_at
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

-- name: claim
-- Lock up to $2 runnable rows with SKIP LOCKED (served by deliveries_pending),
-- take them under a lease and a fresh token, and return them with their payload.
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
          AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active')
        ORDER BY run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.event_id, d.attempts, d.ordering_key, d.run_at
)
SELECT c.id, c.event_id, c.attempts, e.event_type, e.payload, e.headers::text, e.key,
       e.correlation_id, c.ordering_key, e.created_at, c.run_at, e.causation_id
FROM claimed c JOIN {schema}.events e ON e.id = c.event_id
ORDER BY c.run_at, c.id;

-- name: claim_after
-- As claim, starting after the last row this worker claimed ($6, $7). While a
-- long transaction holds back the xmin horizon, entries of rows that are no
-- longer pending stay in deliveries_pending; a claim from the start would walk
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
          AND (run_at, id) > ($6::timestamptz, $7::bigint)
          AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active')
        ORDER BY run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.event_id, d.attempts, d.ordering_key, d.run_at
)
SELECT c.id, c.event_id, c.attempts, e.event_type, e.payload, e.headers::text, e.key,
       e.correlation_id, c.ordering_key, e.created_at, c.run_at, e.causation_id
FROM claimed c JOIN {schema}.events e ON e.id = c.event_id
ORDER BY c.run_at, c.id;

-- name: claim_ordered
-- As claim, for subscriptions that are FIFO per key: a keyed row is taken only
-- as the head of its key (no earlier delivery of the key, by event id, is
-- pending or processing) and only while no delivery of the key is processing;
-- a head waiting for its retry time blocks its key. The checks read the
-- statement's snapshot, so a head that another worker is claiming right now
-- is still pending there and keeps its followers out, while SKIP LOCKED passes
-- over the head itself. The walk in deliveries_pending order passes over the
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
          AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active')
          AND (c.ordering_key IS NULL OR (
                NOT EXISTS (
                    SELECT 1 FROM {schema}.deliveries p
                    WHERE p.subscription_id = $1 AND p.ordering_key = c.ordering_key
                      AND p.status = 'processing' AND p.ordering_key IS NOT NULL)
                AND NOT EXISTS (
                    SELECT 1 FROM {schema}.deliveries p
                    WHERE p.subscription_id = $1 AND p.ordering_key = c.ordering_key
                      AND p.status IN ('pending', 'processing') AND p.event_id < c.event_id)))
        ORDER BY c.run_at, c.id
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING d.id, d.event_id, d.attempts, d.ordering_key, d.run_at
)
SELECT c.id, c.event_id, c.attempts, e.event_type, e.payload, e.headers::text, e.key,
       e.correlation_id, c.ordering_key, e.created_at, c.run_at, e.causation_id
FROM claimed c JOIN {schema}.events e ON e.id = c.event_id
ORDER BY c.run_at, c.id;

-- name: complete
-- One statement per lease token (a claim batch): the primary key is the access
-- path (`id = ANY`) whatever the statistics say, with no join to plan badly.
-- The caller inserts follow-ups only for the (id, token) pairs returned.
UPDATE {schema}.deliveries
SET status = 'completed', lease_until = NULL, lease_token = NULL, updated_at = now()
WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_token = $2
RETURNING id;

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
-- a held xmin horizon keeps in the index. swept_at is where this one ends.
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
)
SELECT (SELECT count(*) FROM recovered) AS recovered, (SELECT count(*) FROM notified) AS notified,
       (SELECT count(*) FROM expired) AS expired, now() AS swept_at;

-- name: next_run_in
-- When the subscription's next claimable delivery is due: the earliest pending
-- row that is unkeyed or the head of a key with nothing processing (as in
-- claim_ordered). No row when every key is busy: the worker then waits for a
-- completion or a wake-up instead of claiming again at once. None for a paused
-- or removed subscription: nothing of it will be claimable. $2, when given, is
-- the run_at of the worker's claim cursor: the walk starts there, past the
-- entries of rows already taken (see claim_after), and what is behind it is
-- left to the worker's next claim from the start.
SELECT extract(epoch FROM c.run_at - now())::float8
FROM {schema}.deliveries c
WHERE c.subscription_id = $1 AND c.status = 'pending'
  AND c.run_at >= coalesce($2::timestamptz, '-infinity')
  AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $1 AND state = 'active')
  AND (c.ordering_key IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM {schema}.deliveries p
            WHERE p.subscription_id = $1 AND p.ordering_key = c.ordering_key
              AND p.status = 'processing' AND p.ordering_key IS NOT NULL)
        AND NOT EXISTS (
            SELECT 1 FROM {schema}.deliveries p
            WHERE p.subscription_id = $1 AND p.ordering_key = c.ordering_key
              AND p.status IN ('pending', 'processing') AND p.event_id < c.event_id)))
ORDER BY c.run_at
LIMIT 1;

-- name: status
-- Counted on the narrow table alone: a subscription has one event type, so
-- the wide events table is not joined.
SELECT s.event_type, s.name AS subscription, c.status, c.count
FROM (SELECT subscription_id, status, count(*) AS count
      FROM {schema}.deliveries GROUP BY 1, 2) c
JOIN {schema}.subscriptions s ON s.id = c.subscription_id
ORDER BY 1, 2, 3;

-- name: status_oldest_pending
SELECT extract(epoch FROM now() - min(run_at))::float8
FROM {schema}.deliveries WHERE status = 'pending' AND run_at <= now();

-- name: status_events
SELECT count(*) FROM {schema}.events;

-- name: status_workers
SELECT id::text, hostname, pid, started_at, heartbeat_at, listener_ok, listener_reconnects,
       extract(epoch FROM now() - heartbeat_at)::float8 AS silent_seconds
FROM {schema}.workers ORDER BY started_at;

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

-- name: subscriptions
-- Every subscription with its backlog, each count served by a partial index
-- (deliveries_pending, deliveries_lease_until: set exactly while processing,
-- deliveries_dead), so a long completed history is never read.
SELECT s.name, s.event_type, s.state, s.ordered, s.created_at, s.worker_seen_at,
       extract(epoch FROM now() - s.worker_seen_at)::float8 AS silent_seconds,
       (SELECT count(*) FROM {schema}.deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'pending') AS pending,
       (SELECT count(*) FROM {schema}.deliveries d
        WHERE d.lease_until IS NOT NULL AND d.subscription_id = s.id
          AND d.status = 'processing') AS processing,
       (SELECT count(*) FROM {schema}.deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'dead') AS dead,
       (SELECT extract(epoch FROM now() - min(d.run_at))::float8 FROM {schema}.deliveries d
        WHERE d.subscription_id = s.id AND d.status = 'pending' AND d.run_at <= now())
           AS lag_seconds
FROM {schema}.subscriptions s
ORDER BY s.name;

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

-- name: detail
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers::text AS headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at
FROM {schema}.deliveries d
JOIN {schema}.subscriptions s ON s.id = d.subscription_id
JOIN {schema}.events e ON e.id = d.event_id
WHERE d.id = $1;

-- name: history
SELECT attempt, error_type, message, traceback, coalesce(duration_seconds, 0) AS duration_seconds,
       worker_id::text, failed_at
FROM {schema}.delivery_attempts WHERE delivery_id = $1 ORDER BY id;

-- name: list_dead
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers::text AS headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at
FROM {schema}.deliveries d
JOIN {schema}.subscriptions s ON s.id = d.subscription_id
JOIN {schema}.events e ON e.id = d.event_id
WHERE d.status = 'dead'
  AND ($1::bigint[] IS NULL OR d.id = ANY($1))
  AND ($2::text IS NULL OR s.name = $2)
  AND ($3::text IS NULL OR e.event_type = $3)
  AND ($4::timestamptz IS NULL OR d.updated_at >= $4)
  AND d.id > $5
ORDER BY d.id
LIMIT $6;

-- name: dead_ids
-- As list_dead, ids only: the next batch of a bulk replay or purge.
SELECT d.id
FROM {schema}.deliveries d
JOIN {schema}.subscriptions s ON s.id = d.subscription_id
JOIN {schema}.events e ON e.id = d.event_id
WHERE d.status = 'dead'
  AND ($1::bigint[] IS NULL OR d.id = ANY($1))
  AND ($2::text IS NULL OR s.name = $2)
  AND ($3::text IS NULL OR e.event_type = $3)
  AND ($4::timestamptz IS NULL OR d.updated_at >= $4)
  AND d.id > $5
ORDER BY d.id
LIMIT $6;

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

-- name: analyze
-- Fresh statistics after a bulk load, so the claim plan is the steady-state one.
ANALYZE {schema}.deliveries, {schema}.events;

-- name: notify_subscriptions
SELECT pg_notify($1, event_type) FROM {schema}.subscriptions WHERE id = ANY($2::int[]);

-- name: migration_lock
-- Serialises migrations of one schema across processes. Transaction-scoped:
-- it ends with the transaction even when the caller is cancelled, whereas a
-- session lock would outlive an interrupted migrate on its pooled connection
-- (the pool does not reset sessions) and block every later migrate.
SELECT pg_advisory_xact_lock(hashtext($1));

-- name: migrations_table
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version, checksum FROM {schema}.schema_migrations;

-- name: migration_record
INSERT INTO {schema}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3);

-- name: schedule_rows_locked
-- Declaring schedules: lock the named rows so two starting workers apply
-- their declarations one after the other.
SELECT *, now() AS db_now FROM {schema}.schedules WHERE name = ANY($1::text[]) ORDER BY name FOR UPDATE;

-- name: schedule_now
SELECT now();

-- name: schedule_declare
-- Create, or update spec and policies in place, one statement for all of a
-- process's schedules. The caller passes the old next occurrence where the
-- times stay, a new one where the spec changed; recorded occurrences stay.
INSERT INTO {schema}.schedules AS s (name, target_kind, target, cron, every_seconds, anchor, timezone,
    missed, max_catchup, overlap, cooldown_seconds, jitter_seconds, dst_gap, dst_fold,
    next_occurrence_at, next_run_at)
SELECT name, target_kind, target, cron, every_seconds, anchor, timezone, missed, max_catchup, overlap,
       cooldown_seconds, jitter_seconds, dst_gap, dst_fold, first, first
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::timestamptz[], $7::text[],
            $8::text[], $9::int[], $10::text[], $11::float8[], $12::float8[], $13::text[], $14::text[],
            $15::timestamptz[])
    AS t(name, target_kind, target, cron, every_seconds, anchor, timezone, missed, max_catchup, overlap,
         cooldown_seconds, jitter_seconds, dst_gap, dst_fold, first)
ON CONFLICT (name) DO UPDATE SET
    target_kind = EXCLUDED.target_kind, target = EXCLUDED.target, cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds, anchor = EXCLUDED.anchor, timezone = EXCLUDED.timezone,
    missed = EXCLUDED.missed, max_catchup = EXCLUDED.max_catchup, overlap = EXCLUDED.overlap,
    cooldown_seconds = EXCLUDED.cooldown_seconds, jitter_seconds = EXCLUDED.jitter_seconds,
    dst_gap = EXCLUDED.dst_gap, dst_fold = EXCLUDED.dst_fold,
    next_occurrence_at = CASE WHEN s.next_occurrence_at = EXCLUDED.next_occurrence_at THEN s.next_occurrence_at
                              ELSE EXCLUDED.next_occurrence_at END,
    next_run_at = CASE WHEN s.next_occurrence_at = EXCLUDED.next_occurrence_at THEN s.next_run_at
                       ELSE EXCLUDED.next_run_at END,
    updated_at = now();

-- name: schedule_set_known
SELECT 1 FROM {schema}.schedule_sets WHERE set_id = $1;

-- name: schedule_set_record
-- The names of a declaration set (content-addressed: written once per set).
WITH s AS (
    INSERT INTO {schema}.schedule_sets (set_id) VALUES ($1) ON CONFLICT (set_id) DO NOTHING
)
INSERT INTO {schema}.schedule_declarations (set_id, name)
SELECT $1, unnest($2::text[])
ON CONFLICT DO NOTHING;

-- name: schedule_claim
-- The tick: lock up to $2 due schedules of this process's declaration set,
-- skipping those another worker is ticking; time is the database's. The set
-- is a correlated subquery, not EXISTS, so it stays a primary-key probe per
-- due row of schedules_due: as a semi-join the planner may start from the
-- set's rows, all of them, when statistics are stale.
SELECT s.*, now() AS db_now FROM {schema}.schedules s
WHERE s.next_run_at <= now() AND (s.paused_at IS NULL OR s.requested)
  AND (SELECT true FROM {schema}.schedule_declarations d WHERE d.set_id = $1 AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT $2
FOR UPDATE OF s SKIP LOCKED;

-- name: schedule_work_open
-- Whether the last fired events' work has finished: every delivery terminal.
-- An event missing here has no delivery (no subscriber): nothing to wait for.
SELECT event_id, count(*) FILTER (WHERE status IN ('pending', 'processing')) AS open,
       max(updated_at) AS last
FROM {schema}.deliveries WHERE event_id = ANY($1::bigint[])
GROUP BY event_id;

-- name: schedule_finished
-- Record when the last firings' work finished, on the schedules and their occurrences.
WITH t AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS t(name, event_id, finished)
), occ AS (
    UPDATE {schema}.schedule_occurrences o SET finished_at = t.finished
    FROM t
    WHERE o.schedule = t.name AND o.event_id = t.event_id AND o.status = 'fired' AND o.finished_at IS NULL
)
UPDATE {schema}.schedules s SET last_finished_at = t.finished
FROM t
WHERE s.name = t.name AND s.last_event_id = t.event_id AND s.last_finished_at IS NULL;

-- name: schedule_requested
-- Triggered or backfilled occurrences waiting to fire, at most $2 per schedule.
SELECT schedule, scheduled_for FROM (
    SELECT schedule, scheduled_for,
           row_number() OVER (PARTITION BY schedule ORDER BY scheduled_for) AS rank
    FROM {schema}.schedule_occurrences
    WHERE schedule = ANY($1::text[]) AND status = 'requested') r
WHERE rank <= $2
ORDER BY schedule, scheduled_for;

-- name: occurrences_insert
-- New occurrences with their fate; a time already recorded keeps its row.
INSERT INTO {schema}.schedule_occurrences (schedule, scheduled_for, status, event_id, fired_at)
SELECT t.name, t.at, t.status, t.event_id, CASE WHEN t.status = 'fired' THEN now() END
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bigint[]) AS t(name, at, status, event_id)
ON CONFLICT (schedule, scheduled_for) DO NOTHING;

-- name: occurrences_fire
-- Requested or buffered occurrences fire now (guarded by their status).
UPDATE {schema}.schedule_occurrences o
SET status = 'fired', event_id = t.event_id, fired_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) AS t(name, at, event_id)
WHERE o.schedule = t.name AND o.scheduled_for = t.at AND o.status IN ('requested', 'buffered');

-- name: schedule_advance
-- Move the schedules on, each guarded by the occurrence it was claimed at
-- (the row locks make the tick the only writer; the guard says so).
UPDATE {schema}.schedules s
SET next_occurrence_at = t.next_occurrence_at, next_run_at = t.next_run_at,
    buffered_for = t.buffered_for,
    last_run_at = CASE WHEN t.last_event_id IS NULL THEN s.last_run_at ELSE now() END,
    last_event_id = coalesce(t.last_event_id, s.last_event_id),
    last_finished_at = CASE WHEN t.last_event_id IS NULL THEN s.last_finished_at END,
    requested = t.requested, updated_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[],
            $6::bigint[], $7::bool[])
    AS t(name, claimed_at, next_occurrence_at, next_run_at, buffered_for, last_event_id, requested)
WHERE s.name = t.name AND s.next_occurrence_at = t.claimed_at
RETURNING s.name;

-- name: schedule_next_due
-- Seconds until the earliest schedule of this process's set is due: the
-- first row of schedules_due that belongs to the set (probed as in the claim).
SELECT extract(epoch FROM s.next_run_at - now())::float8 FROM {schema}.schedules s
WHERE (s.paused_at IS NULL OR s.requested)
  AND (SELECT true FROM {schema}.schedule_declarations d WHERE d.set_id = $1 AND d.name = s.name)
ORDER BY s.next_run_at
LIMIT 1;

-- name: schedules_list
SELECT * FROM {schema}.schedules WHERE $1::text IS NULL OR name = $1 ORDER BY name;

-- name: occurrences_list
-- Newest first; a fired occurrence whose finish the tick has not recorded yet
-- is computed from its deliveries (finished = every delivery terminal).
SELECT o.schedule, o.scheduled_for, o.status, o.event_id, o.fired_at,
       coalesce(o.finished_at, w.finished_at) AS finished_at
FROM {schema}.schedule_occurrences o
LEFT JOIN LATERAL (
    SELECT CASE WHEN count(*) FILTER (WHERE d.status IN ('pending', 'processing')) = 0
                THEN coalesce(max(d.updated_at), o.fired_at) END AS finished_at
    FROM {schema}.deliveries d WHERE d.event_id = o.event_id
) w ON o.status = 'fired'
WHERE o.schedule = $1
ORDER BY o.scheduled_for DESC
LIMIT $2;

-- name: schedule_pause
UPDATE {schema}.schedules
SET paused_at = CASE WHEN $2 THEN coalesce(paused_at, now()) END, updated_at = now()
WHERE name = $1
RETURNING name;

-- name: schedule_remove
WITH gone AS (
    DELETE FROM {schema}.schedules WHERE name = $1 RETURNING name
), occ AS (
    DELETE FROM {schema}.schedule_occurrences o USING gone WHERE o.schedule = gone.name
)
SELECT count(*) FROM gone;

-- name: schedule_request
-- An operator asked for occurrences: lock the schedule and have the next tick
-- look at it now. Returns the database time (a trigger fires at it).
UPDATE {schema}.schedules
SET requested = true, next_run_at = least(next_run_at, now()), updated_at = now()
WHERE name = $1
RETURNING now() AS db_now;

-- name: occurrences_request
-- Record requested occurrences; skipped ones are requested again, fired or
-- waiting ones are left alone (each fires at most once).
INSERT INTO {schema}.schedule_occurrences AS o (schedule, scheduled_for, status)
SELECT $1, t.at, 'requested' FROM unnest($2::timestamptz[]) AS t(at)
ON CONFLICT (schedule, scheduled_for) DO UPDATE SET status = 'requested'
    WHERE o.status IN ('skipped_missed', 'skipped_overlap')
RETURNING o.scheduled_for;
-- Durable state machines ----------------------------------------------------

-- name: wf_load
-- The pointer as committed, read at the start of every visit (no state lives
-- in a worker between visits), with the database clock for age caps.
SELECT i.*, now() AS now,
       EXISTS (SELECT 1 FROM {schema}.wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.consumed_version IS NULL)
           AS has_signals
FROM {schema}.wf_instances i WHERE i.machine = $1 AND i.key = $2;

-- name: wf_load_many
-- wf_load for the visits starting together (one round trip for the batch).
SELECT i.*, now() AS now,
       EXISTS (SELECT 1 FROM {schema}.wf_signals s
               WHERE s.machine = i.machine AND s.key = i.key AND s.consumed_version IS NULL)
           AS has_signals
FROM {schema}.wf_instances i WHERE i.machine = $1 AND i.key = ANY($2::text[]);

-- name: wf_start
-- Create the instance, or begin a new run of a finished one. A live run is
-- untouched and returns no row: starting is idempotent per key.
INSERT INTO {schema}.wf_instances AS i (machine, key, state, status, checkpoint, next_run_at)
VALUES ($1, $2, $3, 'pending', $4, now())
ON CONFLICT (machine, key) DO UPDATE
SET run_id = i.run_id + 1, state = EXCLUDED.state, status = 'pending', version = i.version + 1,
    visits = '{}', attempts = 0, checkpoint = EXCLUDED.checkpoint, last_error_code = NULL,
    last_error = NULL, held_state = NULL, compensate_to = NULL, next_run_at = now(),
    state_entered_at = now(), run_started_at = now(), updated_at = now()
WHERE i.status IN ('completed', 'failed', 'cancelled')
RETURNING i.*, now() AS now, false AS has_signals;

-- name: wf_move
-- The guarded transition and its history row in one statement: only from the
-- version that was read and, for a visit, only while its delivery's lease
-- holds. No row back means a stale visit; the caller writes nothing else.
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
        updated_at = now()
    WHERE machine = $1 AND key = $2 AND version = $15
      AND ($16::bigint IS NULL OR EXISTS (
            SELECT 1 FROM {schema}.deliveries d
            WHERE d.id = $16::bigint AND d.lease_token = $17::uuid AND d.status = 'processing'))
    RETURNING version, run_id
)
INSERT INTO {schema}.wf_history (machine, key, run_id, version, state, visit, outcome, next_state,
                                 yielded, error_code, error, actor, reason, delivery_id, started_at)
SELECT $1, $2, moved.run_id, moved.version, $18, $19, $20, $3, $21, $22, $23, $24, $25, $26,
       COALESCE(to_timestamp($27::float8), now())
FROM moved
RETURNING version;

-- name: wf_move_batch
-- wf_move for a whole batch of transitions that write nothing else, in one
-- statement (one round trip per batch, where one statement per transition
-- cost most of a visit): each row is guarded on its own version and lease;
-- the rows that moved get their history row and their next step event
-- (inserted, fanned out, NOTIFY once per type, as `publish` does). Returns the
-- input position and new version of each row that moved; a missing position
-- was refused.
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[],
                         $7::bytea[], $8::text[], $9::text[], $10::text[], $11::text[],
                         $12::float8[], $13::boolean[], $14::boolean[], $15::bigint[],
                         $16::bigint[], $17::uuid[], $18::text[], $19::int[], $20::text[],
                         $21::boolean[], $22::text[], $23::text[], $24::text[], $25::text[],
                         $26::bigint[], $27::float8[], $28::text[], $29::float8[])
        WITH ORDINALITY AS t(machine, key, state, status, visits, attempts, checkpoint, error_code,
                             error, held_state, compensate_to, next_run_in, entered, new_run,
                             expected, lease_id, lease_token, h_state, visit, outcome, yielded,
                             h_error_code, h_error, actor, reason, delivery_id, started_at, step,
                             step_delay, ord)
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
        updated_at = now()
    FROM input t
    WHERE i.machine = t.machine AND i.key = t.key AND i.version = t.expected
      AND (t.lease_id IS NULL OR EXISTS (
            SELECT 1 FROM {schema}.deliveries d
            WHERE d.id = t.lease_id AND d.lease_token = t.lease_token AND d.status = 'processing'))
    RETURNING t.ord, i.version, i.run_id
), hist AS (
    INSERT INTO {schema}.wf_history (machine, key, run_id, version, state, visit, outcome,
                                     next_state, yielded, error_code, error, actor, reason,
                                     delivery_id, started_at)
    SELECT t.machine, t.key, m.run_id, m.version, t.h_state, t.visit, t.outcome, t.state,
           t.yielded, t.h_error_code, t.h_error, t.actor, t.reason, t.delivery_id,
           COALESCE(to_timestamp(t.started_at), now())
    FROM moved m JOIN input t ON t.ord = m.ord
    RETURNING 1
), step AS (
    INSERT INTO {schema}.events (event_type, key, payload, ordering_key, deliver_at)
    SELECT 'wf.step.' || t.machine, 'wf/' || t.machine || '/' || t.key || '/v' || m.version || '/' || t.step,
           convert_to(jsonb_build_object('key', t.key, 'version', m.version, 'reason', t.step)::text,
                      'UTF8'),
           t.machine || '/' || t.key, now() + t.step_delay * interval '1 second'
    FROM moved m JOIN input t ON t.ord = m.ord
    WHERE t.step IS NOT NULL
    ORDER BY t.ord
    ON CONFLICT (event_type, key) DO NOTHING
    RETURNING id, event_type, ordering_key, deliver_at
), fanout AS (
    INSERT INTO {schema}.deliveries (event_id, subscription_id, ordering_key, run_at)
    SELECT step.id, s.id, CASE WHEN s.ordered THEN step.ordering_key END, step.deliver_at
    FROM step JOIN {schema}.subscriptions s
      ON s.event_type = step.event_type AND s.state <> 'removed'
), notified AS (
    SELECT pg_notify($30, x.event_type) FROM (SELECT DISTINCT event_type FROM step) x
)
SELECT m.ord, m.version, (SELECT count(*) FROM notified) AS notified,
       (SELECT count(*) FROM hist) AS written
FROM moved m;

-- name: wf_consume_signals
-- Signals read by the visit are consumed by its transition, never before.
UPDATE {schema}.wf_signals SET consumed_version = $3
WHERE machine = $1 AND key = $2 AND id = ANY($4::bigint[]) AND consumed_version IS NULL;

-- name: wf_signal_waiting
-- Is a signal the state wakes on already here? Then its yield ends at once.
SELECT EXISTS (SELECT 1 FROM {schema}.wf_signals
               WHERE machine = $1 AND key = $2 AND consumed_version IS NULL
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
-- decision is used once: the transition that acts on it stamps its version.
UPDATE {schema}.wf_approvals
SET status = $3::text,
    consumed_version = CASE WHEN $3::text IN ('approved', 'denied') THEN $4::bigint END
WHERE id = $1 AND status = $2 AND consumed_version IS NULL;

-- name: wf_lock
-- Signals and decisions lock the pointer first, so a transition committing
-- concurrently either sees their row or is seen by them.
SELECT state, status, version FROM {schema}.wf_instances
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
INSERT INTO {schema}.wf_signals (machine, key, name, dedupe, payload)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (machine, key, name, dedupe) DO NOTHING
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

-- name: wf_history
SELECT run_id, version, state, visit, outcome, next_state, yielded, error_code, error, actor,
       reason, delivery_id, started_at, at
FROM {schema}.wf_history WHERE machine = $1 AND key = $2 ORDER BY version;

-- name: wf_signals
SELECT id, name, dedupe, payload, created_at, consumed_version FROM {schema}.wf_signals
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
SELECT i.key, i.version FROM {schema}.wf_instances i
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

-- ---------------------------------------------------------------------------
-- Observability and retention (Inspector.chain/health, RetentionStore).

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
FROM {schema}.deliveries d
JOIN {schema}.subscriptions s ON s.id = d.subscription_id
JOIN {schema}.events e ON e.id = d.event_id
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

-- name: health_subscriptions
-- Per subscription, from the partial indexes only: pending rows
-- (deliveries_pending), rows under a lease (deliveries_lease_until), dead rows
-- (deliveries_dead).
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
-- table degrades (dead index entries walked by every claim).
SELECT t.relname AS table, t.n_live_tup AS live_tuples, t.n_dead_tup AS dead_tuples,
       pg_total_relation_size(t.relid) AS total_bytes, t.last_autovacuum
FROM pg_stat_user_tables t
WHERE t.schemaname = $1
ORDER BY t.relname;

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

-- name: prune_try_lock
-- One pruner at a time per schema (a session lock, released after the pass).
SELECT pg_try_advisory_lock(hashtext($1 || ':prune'));

-- name: prune_unlock
SELECT pg_advisory_unlock(hashtext($1 || ':prune'));

-- name: prune_batch
-- One batch of the retention walk: the next $2 events after $1 in primary key
-- order (a bounded range read), their deliveries finished before their
-- retention cutoff ($3 completed/cancelled, $4 dead, in seconds; NULL keeps
-- them; a subscription named in $7 has its own cutoffs $8, $9; $10 is the
-- shortest cutoff of all) with their attempt history, then the events of the batch older than
-- $3 and, when keyed, than the dedup window $5, with no delivery left. A
-- pending, processing or retained dead delivery keeps its event. Rows another
-- transaction holds (a replay) are skipped, never waited for. Data-modifying
-- CTEs share one snapshot, so the deliveries deleted here are excluded by id.
WITH batch AS (
    SELECT id, key, created_at FROM {schema}.events WHERE id > $1 ORDER BY id LIMIT $2
), overrides AS (
    SELECT s.id, o.completed, o.dead
    FROM unnest($7::text[], $8::float8[], $9::float8[]) AS o(name, completed, dead)
    JOIN {schema}.subscriptions s ON s.name = o.name
), doomed AS (
    SELECT d.id, d.status
    FROM {schema}.deliveries d
    JOIN batch b ON d.event_id = b.id
    LEFT JOIN overrides o ON o.id = d.subscription_id
    CROSS JOIN LATERAL (
        SELECT CASE WHEN o.id IS NULL THEN $3::float8 ELSE o.completed END AS completed,
               CASE WHEN o.id IS NULL THEN $4::float8 ELSE o.dead END AS dead) r
    WHERE (d.status IN ('completed', 'cancelled') AND r.completed IS NOT NULL
           AND d.updated_at < now() - r.completed * interval '1 second')
       OR (d.status = 'dead' AND r.dead IS NOT NULL
           AND d.updated_at < now() - r.dead * interval '1 second')
    FOR UPDATE OF d SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.deliveries d USING doomed
    WHERE d.id = doomed.id AND d.status = doomed.status AND NOT $6
    RETURNING d.id, d.status
), history AS (
    DELETE FROM {schema}.delivery_attempts a USING gone WHERE a.delivery_id = gone.id
    RETURNING 1
), events_doomed AS (
    SELECT b.id FROM batch b
    WHERE $3::float8 IS NOT NULL AND b.created_at < now() - $3 * interval '1 second'
      AND (b.key IS NULL OR b.created_at < now() - $5 * interval '1 second')
      AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                      WHERE d.event_id = b.id AND d.id NOT IN (SELECT id FROM doomed))
), events_gone AS (
    DELETE FROM {schema}.events e USING events_doomed x WHERE e.id = x.id AND NOT $6
    RETURNING e.id
)
SELECT (SELECT max(id) FROM batch) AS last_id,
       (SELECT min(created_at) >= now() - coalesce($10::float8, 0) * interval '1 second'
        FROM batch) AS young,
       (SELECT count(*) FROM doomed WHERE status <> 'dead') AS completed,
       (SELECT count(*) FROM doomed WHERE status = 'dead') AS dead,
       (SELECT count(*) FROM history) AS attempts,
       (SELECT count(*) FROM events_doomed) AS events;

-- name: prune_record
INSERT INTO {schema}.maintenance (name, ran_at, report) VALUES ('prune', now(), $1::jsonb)
ON CONFLICT (name) DO UPDATE SET ran_at = now(), report = EXCLUDED.report;

-- name: inspect_timeout
-- Dashboard reads run in a read-only transaction with their own statement
-- timeout, so a heavy filter can never hold a connection for long.
SET LOCAL statement_timeout = '5s';

-- name: find_deliveries
-- The dashboard's delivery list: every filter optional, newest first below a
-- cursor id (one descending walk of the primary key, however deep the page).
-- The payload filter decodes JSON only for rows the cheaper filters kept.
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.correlation_id, d.last_error, d.replays, d.run_at, d.updated_at, e.created_at
FROM {schema}.deliveries d
JOIN {schema}.subscriptions s ON s.id = d.subscription_id
JOIN {schema}.events e ON e.id = d.event_id
WHERE ($1::text IS NULL OR s.name = $1)
  AND ($2::text IS NULL OR d.status = $2)
  AND ($3::text IS NULL OR e.event_type = $3)
  AND ($4::bigint IS NULL OR d.event_id = $4)
  AND ($5::text IS NULL OR e.key = $5)
  AND ($6::bigint IS NULL OR e.correlation_id = $6 OR e.id = $6)
  AND ($7::timestamptz IS NULL OR d.updated_at >= $7)
  AND ($8::timestamptz IS NULL OR d.updated_at < $8)
  AND ($9::text[] IS NULL OR convert_from(e.payload, 'UTF8')::jsonb #>> $9 = $10)
  AND ($11::bigint IS NULL OR d.id < $11)
ORDER BY d.id DESC
LIMIT $12;

-- name: count_deliveries
-- As find_deliveries, counted no further than $11 rows: a capped count stays
-- fast at millions of rows and the page shows "N+".
SELECT count(*) FROM (
    SELECT 1
    FROM {schema}.deliveries d
    JOIN {schema}.subscriptions s ON s.id = d.subscription_id
    JOIN {schema}.events e ON e.id = d.event_id
    WHERE ($1::text IS NULL OR s.name = $1)
      AND ($2::text IS NULL OR d.status = $2)
      AND ($3::text IS NULL OR e.event_type = $3)
      AND ($4::bigint IS NULL OR d.event_id = $4)
      AND ($5::text IS NULL OR e.key = $5)
      AND ($6::bigint IS NULL OR e.correlation_id = $6 OR e.id = $6)
      AND ($7::timestamptz IS NULL OR d.updated_at >= $7)
      AND ($8::timestamptz IS NULL OR d.updated_at < $8)
      AND ($9::text[] IS NULL OR convert_from(e.payload, 'UTF8')::jsonb #>> $9 = $10)
    LIMIT $11
) capped;

-- name: event_row
SELECT id, event_type, key, payload, headers::text AS headers, correlation_id, causation_id, created_at
FROM {schema}.events WHERE id = $1;

-- name: event_deliveries
-- Every delivery of one event (the unique (event_id, subscription_id) index finds them).
SELECT d.id, d.event_id, s.name AS subscription, e.event_type, d.status, d.attempts, e.key,
       e.payload, e.headers::text AS headers, e.correlation_id, e.causation_id, d.last_error,
       d.replays, d.run_at, d.updated_at, e.created_at
FROM {schema}.deliveries d
JOIN {schema}.subscriptions s ON s.id = d.subscription_id
JOIN {schema}.events e ON e.id = d.event_id
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

-- name: event_chain
-- The root of the event's chain and every event carrying that root as its
-- correlation id; causation_id links each to its parent.
WITH root AS (SELECT coalesce(correlation_id, id) AS id FROM {schema}.events WHERE id = $1)
SELECT e.id, e.event_type, e.key, e.correlation_id, e.causation_id, e.created_at
FROM {schema}.events e, root
WHERE e.id = root.id OR e.correlation_id = root.id
ORDER BY e.id
LIMIT $2;
