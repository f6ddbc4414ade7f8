-- The append-only hot path of the PostgreSQL backend (PgRing; the protocol is
-- in ring.py, the tables in migration 0024). {schema} is the validated, quoted
-- schema. Every statement that reads ring_ready or ring_claims names the slots
-- it may touch as $1 and runs with a custom plan (the bus's connections set
-- plan_cache_mode = force_custom_plan), so PostgreSQL prunes the other slots
-- at plan time and never locks them: a slot being emptied by TRUNCATE is not
-- in any worker's window, and no claim waits for it.
--
-- "No claim row took this ready row" is always a probe of ring_claims by its
-- primary key, one per ready row read: the `OFFSET 0` in each such NOT EXISTS
-- keeps PostgreSQL from planning it as a join. A slot's partitions fill and
-- empty in seconds, so their statistics are often wrong; an ANALYZE that ran
-- while every claim row it sampled was still uncommitted records pages but
-- no rows, and the slot's claims are then estimated at one row however many
-- it holds. Planned as a join on that estimate, the claim materialized every
-- claim row of the slot and compared each ready row with all of them (50 ms
-- per claim of 100 at 20,000 claimed, against about 1 ms).

-- The same holds for "no outcome row under this claim's key": a probe of the
-- outcome log's primary key per claim (`OFFSET 0` again), whatever the
-- statistics of the claim's day. A day analyzed while the outcome rows it
-- sampled were uncommitted is estimated at one row however many millions it
-- holds; planned as a join on that estimate, a renewal's check of 100 claims
-- compared each with every outcome row of the day (43 s at a million, against
-- 3 ms), and a retention pass over a chunk each ready row (10 s, against 0.1 s).

-- name: _ring_open
-- A ring claim (c) not settled yet: no outcome row under its key.
NOT EXISTS (SELECT 1 FROM {schema}.delivery_log l
            WHERE l.claimed_on = (c.claimed_at AT TIME ZONE 'UTC')::date
              AND l.delivery_id = c.delivery_id OFFSET 0)

-- name: _ring_unsettled
-- A ready row (r) whose delivery has no outcome yet: unclaimed, or claimed with
-- no outcome row (a completed one is history; a moved one lives in deliveries).
NOT EXISTS (SELECT 1 FROM {schema}.ring_claims c
            JOIN {schema}.delivery_log l
              ON l.delivery_id = c.delivery_id
             AND l.claimed_on = (c.claimed_at AT TIME ZONE 'UTC')::date
            WHERE c.slot = r.slot AND c.delivery_id = r.delivery_id OFFSET 0)

-- name: _ring_unclaimed
-- A ready row (r) of the slots $1 that no claim row took: a probe of
-- ring_claims by its primary key, one per ready row (`OFFSET 0`, see above).
-- ring_claim_queue (slots $7) and ring_spill (one slot) write it out.
NOT EXISTS (SELECT 1 FROM {schema}.ring_claims c
            WHERE c.slot = ANY($1::smallint[]) AND c.slot = r.slot
              AND c.delivery_id = r.delivery_id OFFSET 0)

-- name: ring_window
-- The ring's live generations (at most the ring's size, the newest first): a
-- slot is open from its 'open' row to its 'pruned' row; workers claim from
-- the open ones without a 'closing' row. $1: the ring's size.
SELECT o.gen, o.slot, o.first_id, extract(epoch FROM now() - o.at)::float8 AS age,
       c.at IS NOT NULL AS closing, extract(epoch FROM now() - c.at)::float8 AS closing_for
FROM {schema}.ring_log o
LEFT JOIN {schema}.ring_log c ON c.gen = o.gen AND c.kind = 'closing'
WHERE o.kind = 'open'
  AND o.gen > (SELECT max(gen) FROM {schema}.ring_log) - $1
  AND NOT EXISTS (SELECT 1 FROM {schema}.ring_log p WHERE p.gen = o.gen AND p.kind = 'pruned')
ORDER BY o.gen DESC;

-- name: ring_claim
-- Lock up to $4 ready rows of subscription $2 in the window's slots $1, after
-- the cursor $3 (a delivery id; 0 from the start), that no claim row has
-- taken, and take them: one claim row each under the token $5, lease $7
-- seconds, worker $6. SKIP LOCKED keeps two claimers off the same row at the
-- same moment; the anti-join keeps a claimer off rows already claimed; the
-- primary key of ring_claims (ON CONFLICT DO NOTHING) settles the rest: a
-- claimer whose snapshot predates another's claim passes the anti-join and
-- locks the row after the first released it, and its insert then finds the key
-- taken. Only the rows whose claim was inserted come back, with their event.
WITH picked AS (
    SELECT r.slot, r.delivery_id, r.event_id, r.enqueued_at
    FROM {schema}.ring_ready r
    WHERE r.slot = ANY($1::smallint[]) AND r.subscription_id = $2 AND r.delivery_id > $3
      AND {_ring_unclaimed}
      AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $2 AND state = 'active')
    ORDER BY r.delivery_id
    LIMIT $4
    FOR UPDATE OF r SKIP LOCKED
), won AS (
    INSERT INTO {schema}.ring_claims (slot, delivery_id, subscription_id, event_id, lease_token,
                                      worker_id, lease_until, enqueued_at)
    SELECT slot, delivery_id, $2, event_id, $5, $6, now() + $7 * interval '1 second', enqueued_at
    FROM picked
    ON CONFLICT DO NOTHING
    RETURNING slot, delivery_id, event_id, enqueued_at
)
SELECT c.delivery_id, c.event_id, 1 AS attempts, e.event_type, e.payload, e.headers::text, e.key,
       e.correlation_id, NULL::text AS ordering_key, e.created_at, c.enqueued_at, e.causation_id,
       e.version, e.priority, c.slot
FROM won c CROSS JOIN LATERAL {_event_of_claim} AS e
ORDER BY c.delivery_id;

-- name: ring_claim_queue
-- The claim from deliveries beside the ring (retries, spilled backlogs,
-- prioritised and delayed deliveries): as `claim` in delivery.sql, taking
-- only the rows whose place comes before the ring's next row (its publish
-- time: a ring row is of priority 0, so its place is when it was published),
-- so one batch takes both in place order. A separate statement, not a
-- parameter of `claim`: a plan of `claim` that named the ring's partitions
-- would lock all of them at every claim of a bus without the ring. $7: the
-- window's slots, $8: the ring cursor.
WITH claimed AS (
    UPDATE {schema}.deliveries d
    SET status = 'processing', attempts = d.attempts + 1,
        lease_until = now() + $3 * interval '1 second', lease_token = $4, worker_id = $5,
        ordering_key = NULL, updated_at = now()
    WHERE d.id = ANY(ARRAY(
        SELECT id FROM {schema}.deliveries
        WHERE subscription_id = $1 AND status = 'pending' AND run_at <= now()
          AND {schema}.claim_place(run_at, priority_wait) <= now() + $6 * interval '1 second'
          AND {schema}.claim_place(run_at, priority_wait) <= coalesce((
                SELECT r.enqueued_at FROM {schema}.ring_ready r
                WHERE r.slot = ANY($7::smallint[]) AND r.subscription_id = $1 AND r.delivery_id > $8
                  AND NOT EXISTS (SELECT 1 FROM {schema}.ring_claims c
                                  WHERE c.slot = ANY($7::smallint[]) AND c.slot = r.slot
                                    AND c.delivery_id = r.delivery_id OFFSET 0)
                ORDER BY r.delivery_id LIMIT 1), 'infinity')
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

-- name: ring_waiting
-- Whether subscription $2 (active) has a ready row no claim took in the slots
-- $1: then its next claim is due now (every ring row is due when published).
SELECT EXISTS (
    SELECT 1 FROM {schema}.ring_ready r
    WHERE r.slot = ANY($1::smallint[]) AND r.subscription_id = $2
      AND {_ring_unclaimed})
   AND EXISTS (SELECT 1 FROM {schema}.subscriptions WHERE id = $2 AND state = 'active');

-- name: ring_complete
-- The completion of ring claims: one outcome row each, for the claims of the
-- ids $2 still held under the token $3, looked up in the slots $1 (those of
-- this process's claims, or every live slot for claims another process made:
-- a pull consumer hands its ids and token on). The outcome log's key is the
-- second fence: a claim already settled (taken back for an expired lease,
-- moved, cancelled) has its key taken, and the insert does nothing. Returns
-- the ids completed.
INSERT INTO {schema}.delivery_log (claimed_on, delivery_id, subscription_id, event_id, status,
                                   worker_id, enqueued_at, claimed_at)
SELECT (c.claimed_at AT TIME ZONE 'UTC')::date, c.delivery_id, c.subscription_id, c.event_id,
       'completed', c.worker_id, c.enqueued_at, c.claimed_at
FROM {schema}.ring_claims c
WHERE c.slot = ANY($1::smallint[]) AND c.delivery_id = ANY($2::bigint[]) AND c.lease_token = $3
ON CONFLICT DO NOTHING
RETURNING delivery_id;

-- name: ring_held
-- Of the ids $2 in the slots $1, those still held under the token $3 in the
-- ring (claimed, no outcome yet): a renewal that need not write yet reads this.
SELECT c.delivery_id FROM {schema}.ring_claims c
WHERE c.slot = ANY($1::smallint[]) AND c.delivery_id = ANY($2::bigint[]) AND c.lease_token = $3
  AND {_ring_open};

-- name: ring_move
-- Open ring claims into deliveries, as processing rows under the same lease
-- (token, worker, lease end, one attempt): from there on, today's statements
-- settle them (a failure, a release, a renewal, an expired lease, a lost
-- worker, an operator's action). The outcome row 'moved' is the fence: a
-- completion that comes after finds its key taken and completes the
-- deliveries row instead. Which claims: in the slots $1, those of the ids $2
-- (NULL: any) held under the token $3 (NULL: any), by the workers $4 (NULL:
-- any), whose lease ended ($5: only those) — at most $6. Each outcome row
-- written finds its claim again by key (`OFFSET 0`: a probe per row, as the
-- claim's anti-join), never as a join of the claims moved with the outcome
-- rows written: both are estimated from the slot's statistics, one row after
-- an ANALYZE that saw only uncommitted claims, and that join was a nested
-- loop comparing every claim moved with every other (14 s for a prune that
-- moved 10,000 open claims, against 0.2 s by key).
WITH logged AS (
    INSERT INTO {schema}.delivery_log (claimed_on, delivery_id, subscription_id, event_id, status,
                                       worker_id, enqueued_at, claimed_at)
    SELECT (c.claimed_at AT TIME ZONE 'UTC')::date, c.delivery_id, c.subscription_id, c.event_id,
           'moved', c.worker_id, c.enqueued_at, c.claimed_at
    FROM {schema}.ring_claims c
    WHERE c.slot = ANY($1::smallint[])
      AND ($2::bigint[] IS NULL OR c.delivery_id = ANY($2::bigint[]))
      AND ($3::uuid IS NULL OR c.lease_token = $3::uuid)
      AND ($4::uuid[] IS NULL OR c.worker_id = ANY($4::uuid[]))
      AND (NOT $5::bool OR c.lease_until < now())
      AND {_ring_open}
    ORDER BY c.lease_until
    LIMIT $6
    ON CONFLICT DO NOTHING
    RETURNING delivery_id
)
INSERT INTO {schema}.deliveries (id, event_id, subscription_id, status, attempts, run_at,
                                 lease_until, lease_token, worker_id)
OVERRIDING SYSTEM VALUE
SELECT o.delivery_id, o.event_id, o.subscription_id, 'processing', 1, o.enqueued_at,
       o.lease_until, o.lease_token, o.worker_id
FROM logged l
CROSS JOIN LATERAL (SELECT c.* FROM {schema}.ring_claims c
                    WHERE c.slot = ANY($1::smallint[]) AND c.delivery_id = l.delivery_id
                    OFFSET 0) o
RETURNING id;

-- name: ring_spill
-- The ready rows of slot $1 that no claim took, into deliveries as pending
-- rows in their place (run_at when published): the slot is about to be
-- emptied (a backlog older than the ring, a paused subscription, a row a late
-- publish put in a slot already closed). A subscription made ordered since
-- gets its ordering keys. Notifies, as a publish does.
WITH moved AS (
    INSERT INTO {schema}.deliveries (id, event_id, subscription_id, status, run_at, ordering_key)
    OVERRIDING SYSTEM VALUE
    SELECT r.delivery_id, r.event_id, r.subscription_id, 'pending', r.enqueued_at,
           CASE WHEN s.ordered THEN e.ordering_key END
    FROM {schema}.ring_ready r
    JOIN {schema}.subscriptions s ON s.id = r.subscription_id
    JOIN {schema}.events e ON e.id = r.event_id
    WHERE r.slot = $1
      AND NOT EXISTS (SELECT 1 FROM {schema}.ring_claims c
                      WHERE c.slot = $1 AND c.delivery_id = r.delivery_id OFFSET 0)
    ORDER BY r.delivery_id
    RETURNING subscription_id
), notified AS (
    SELECT pg_notify($2, s.event_type) FROM {schema}.subscriptions s
    WHERE s.id IN (SELECT DISTINCT subscription_id FROM moved)
)
SELECT (SELECT count(*) FROM moved) AS spilled, (SELECT count(*) FROM notified) AS notified;

-- name: ring_evict
-- Every ready row in the slots $1 of subscription $2 (NULL: any) among the
-- ids $3 (NULL: any) that no claim took, into deliveries as pending (with
-- its ordering key if the subscription is ordered now): when a subscription
-- becomes ordered (its FIFO per key is kept in deliveries) or is removed (its
-- pending rows are cancelled there), before an operator's action by id.
-- Each row is fenced as a claim is: a tombstone claim (no worker, its lease
-- over) and the outcome 'moved' under its key, so a claimer that locked the
-- row first keeps it and this statement leaves it alone. The deliveries rows
-- are made from the outcome rows written, which carry what they need, never
-- from a join of the claims inserted with the outcome rows: both are
-- estimated from the slot's statistics, one row after an ANALYZE that saw
-- only uncommitted ready rows (a slot sealed during one large publish), and
-- that join was a nested loop comparing every row evicted with every other
-- (13 s to evict 10,000 rows, against 0.24 s).
WITH picked AS (
    SELECT r.slot, r.delivery_id, r.event_id, r.subscription_id, r.enqueued_at
    FROM {schema}.ring_ready r
    WHERE r.slot = ANY($1::smallint[])
      AND ($2::int IS NULL OR r.subscription_id = $2::int)
      AND ($3::bigint[] IS NULL OR r.delivery_id = ANY($3::bigint[]))
      AND {_ring_unclaimed}
    FOR UPDATE OF r SKIP LOCKED
), taken AS (
    INSERT INTO {schema}.ring_claims (slot, delivery_id, subscription_id, event_id, lease_token,
                                      worker_id, lease_until, enqueued_at)
    SELECT slot, delivery_id, subscription_id, event_id, gen_random_uuid(),
           '00000000-0000-0000-0000-000000000000', now(), enqueued_at
    FROM picked
    ON CONFLICT DO NOTHING
    RETURNING slot, delivery_id, subscription_id, event_id, enqueued_at, claimed_at
), logged AS (
    INSERT INTO {schema}.delivery_log (claimed_on, delivery_id, subscription_id, event_id, status,
                                       enqueued_at, claimed_at)
    SELECT (claimed_at AT TIME ZONE 'UTC')::date, delivery_id, subscription_id, event_id, 'moved',
           enqueued_at, claimed_at
    FROM taken
    ON CONFLICT DO NOTHING
    RETURNING delivery_id, event_id, subscription_id, enqueued_at
)
INSERT INTO {schema}.deliveries (id, event_id, subscription_id, status, run_at, ordering_key)
OVERRIDING SYSTEM VALUE
SELECT l.delivery_id, l.event_id, l.subscription_id, 'pending', l.enqueued_at,
       CASE WHEN s.ordered THEN e.ordering_key END
FROM logged l
JOIN {schema}.subscriptions s ON s.id = l.subscription_id
JOIN {schema}.events e ON e.id = l.event_id
RETURNING id;

-- name: ring_unclaimed
-- Whether a ready row of slot $1 has no claim. Every claim row of a slot is
-- the claim of one of its ready rows, so the two counts answer it; an
-- anti-join over two freshly filled partitions is planned on estimates of one
-- row, as a nested loop.
SELECT (SELECT count(*) FROM {schema}.ring_ready WHERE slot = $1)
     > (SELECT count(*) FROM {schema}.ring_claims WHERE slot = $1);

-- name: ring_holds_rows
-- Whether slot $1 (closed or pruned) still holds a ready row: a publish that
-- read the ring's state before the slot was closed and inserted after it was
-- emptied.
SELECT EXISTS (SELECT 1 FROM {schema}.ring_ready WHERE slot = $1);

-- name: ring_lost_candidates
-- As lost_worker_candidates, for ring claims: workers silent for $1 seconds
-- or on host $2, heard from recently enough to hold a claim still in the ring
-- (an older claim has left it with its slot and is found in deliveries).
SELECT w.id::text AS id, w.hostname, w.pid, extract(epoch FROM now() - w.heartbeat_at)::float8 AS silent
FROM {schema}.workers w
WHERE (w.heartbeat_at < now() - make_interval(secs => $1) OR w.hostname = $2)
  AND w.heartbeat_at > now() - interval '10 minutes';

-- name: ring_leader
-- One upkeep of the ring at a time per schema, for this transaction.
SELECT pg_try_advisory_xact_lock(hashtext($1 || ':ring'));

-- name: ring_next_id
-- Where the delivery id sequence stands (what a slot opened at, and its fill).
SELECT last_value FROM {schema}.deliveries_id_seq;

-- name: ring_mark
-- A state change of generation $1 (slot $2): 'open', 'closing' or 'pruned'.
INSERT INTO {schema}.ring_log (gen, kind, slot, first_id)
VALUES ($1, $3, $2, (SELECT last_value FROM {schema}.deliveries_id_seq))
ON CONFLICT DO NOTHING;

-- name: ring_lock_timeout
-- The bound on every lock wait of this transaction (the prune's).
SELECT set_config('lock_timeout', $1, true);

-- name: ring_lock_slot
-- Both partitions of slot $1, ACCESS EXCLUSIVE, waiting at most the
-- transaction's lock_timeout (set before: a claim never waits long behind it).
SELECT {schema}.ring_lock_slot($1::smallint);

-- name: ring_truncate_slot
SELECT {schema}.ring_truncate_slot($1::smallint);

-- name: ring_analyze_slot
-- Statistics of a slot just sealed, so claims are planned on its real size (a
-- truncated and refilled partition has none, and a claim on it was planned as
-- a scan and sort of the whole slot).
SELECT {schema}.ring_analyze_slot($1::smallint);

-- name: ring_days_lock
-- Made one process at a time (concurrent CREATE TABLE of one name collide).
SELECT pg_advisory_xact_lock(hashtext($1 || ':ring days'));

-- name: ring_make_days
-- The outcome log's partitions of today and the next $1 days (UTC).
SELECT {schema}.delivery_log_make((now() AT TIME ZONE 'UTC')::date + d)
FROM generate_series(0, $1::int) AS d;

-- name: ring_drop_days
-- Drop the outcome log's days ending before now() - $1 seconds, at most $2 of
-- them; returns the days dropped. A ring claim's day is never dropped while
-- the claim is in the ring (the ring holds minutes, retention days).
SELECT {schema}.delivery_log_drop(((now() - $1 * interval '1 second') AT TIME ZONE 'UTC')::date, $2::int);

-- name: ring_forget
-- The ring's ledger keeps the generations of the last $1 rotations.
DELETE FROM {schema}.ring_log WHERE gen < (SELECT max(gen) FROM {schema}.ring_log) - $1;
