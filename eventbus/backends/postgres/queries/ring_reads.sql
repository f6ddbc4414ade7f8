-- The reads of a bus on the append-only path (see take_append_only in _db.py)
-- that count or walk every delivery. A delivery lives in one of three stores
-- (deliveries, the ring, the outcome log of delivery_log); delivery_rows shows
-- them as one, but the planner reads the log's branch of that UNION ALL as a
-- subquery: an aggregate or a newest-first walk over the view reads every
-- outcome (300 ms at 300,000 of them). These read each store on its own,
-- where its indexes serve, and add up or merge what each found. The lists,
-- capped counts and id walks of inspect.sql are run once per store, with
-- ring_rows_ready and ring_rows_log (the fragments below, as queries) written
-- in place of deliveries (see _per_store in _db.py).

-- name: _ring_rows_ready
-- The ring's deliveries as delivery_rows shows them (its second branch): a
-- ready row no claim took is pending; a claim without an outcome, processing.
-- Its outcome row is looked up by key (`OFFSET 0`, as _ring_open in ring.sql):
-- on a day analyzed while its rows were uncommitted, the lookup was planned as
-- a hash of every outcome row of the day (a million read to list the newest
-- 100 deliveries: 0.9 s, against 17 ms).
SELECT r.delivery_id AS id, r.event_id, r.subscription_id,
       CASE WHEN c.delivery_id IS NULL THEN 'pending' ELSE 'processing' END AS status,
       CASE WHEN c.delivery_id IS NULL THEN 0 ELSE 1 END AS attempts, r.enqueued_at AS run_at,
       c.lease_until, c.lease_token, c.worker_id, NULL::text AS last_error, NULL::text AS ordering_key,
       0 AS replays, NULL::timestamptz AS replayed_at, coalesce(c.claimed_at, r.enqueued_at) AS updated_at,
       0::real AS priority_wait
FROM {schema}.ring_ready r
LEFT JOIN {schema}.ring_claims c ON c.slot = r.slot AND c.delivery_id = r.delivery_id
WHERE c.delivery_id IS NULL
   OR NOT EXISTS (SELECT 1 FROM {schema}.delivery_log l
                  WHERE l.claimed_on = (c.claimed_at AT TIME ZONE 'UTC')::date
                    AND l.delivery_id = c.delivery_id OFFSET 0)

-- name: _ring_rows_log
-- The completed outcomes as delivery_rows shows them (its third branch). One
-- table in a subquery of its own, the planner flattens it: a walk by id reads
-- each day's primary key backward (a merge of the days), a filter on a column
-- set here to a constant drops the branch when planned for its parameters.
SELECT l.delivery_id AS id, l.event_id, l.subscription_id, 'completed'::text AS status, 1 AS attempts,
       l.enqueued_at AS run_at, NULL::timestamptz AS lease_until, NULL::uuid AS lease_token, l.worker_id,
       NULL::text AS last_error, NULL::text AS ordering_key, 0 AS replays, NULL::timestamptz AS replayed_at,
       l.finished_at AS updated_at, 0::real AS priority_wait
FROM {schema}.delivery_log l
WHERE l.status = 'completed'

-- name: ring_status
-- status: each store counted on its own and the counts added up; the
-- completed outcomes grouped on the narrow log alone.
SELECT s.event_type, s.name AS subscription, c.status, sum(c.count)::bigint AS count
FROM (SELECT subscription_id, status, count(*) AS count
      FROM {schema}.deliveries GROUP BY 1, 2
      UNION ALL
      SELECT r.subscription_id, r.status, count(*) FROM ({_ring_rows_ready}) r GROUP BY 1, 2
      UNION ALL
      SELECT subscription_id, 'completed', count(*)
      FROM {schema}.delivery_log WHERE status = 'completed' GROUP BY 1) c
JOIN {schema}.subscriptions s ON s.id = c.subscription_id
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

-- name: _ring_newest
-- The newest $1 deliveries of the three stores: each store's newest $1 by id
-- (deliveries' primary key, the ring's few rows, each day's primary key of
-- the log, merged), then the newest $1 of those.
SELECT w.id, w.subscription_id, w.status, w.updated_at FROM (
    (SELECT id, subscription_id, status, updated_at FROM {schema}.deliveries ORDER BY id DESC LIMIT $1)
    UNION ALL
    (SELECT r.id, r.subscription_id, r.status, r.updated_at FROM ({_ring_rows_ready}) r
     ORDER BY r.id DESC LIMIT $1)
    UNION ALL
    (SELECT delivery_id, subscription_id, 'completed', finished_at FROM {schema}.delivery_log
     WHERE status = 'completed' ORDER BY delivery_id DESC LIMIT $1)) w
ORDER BY w.id DESC
LIMIT $1

-- name: ring_rows_ready
{_ring_rows_ready};

-- name: ring_rows_log
{_ring_rows_log};

-- name: ring_status_recent
-- status_recent over _ring_newest.
SELECT s.event_type, s.name AS subscription, c.status, c.count
FROM (SELECT subscription_id, status, count(*) AS count FROM ({_ring_newest}) w GROUP BY 1, 2) c
JOIN {schema}.subscriptions s ON s.id = c.subscription_id
ORDER BY 1, 2, 3;

-- name: ring_health_completed_recent
-- health_completed_recent over _ring_newest.
SELECT subscription_id,
       count(*) FILTER (WHERE status = 'completed' AND updated_at > now() - interval '1 hour') AS n,
       count(*) AS examined
FROM ({_ring_newest}) recent
GROUP BY 1;
