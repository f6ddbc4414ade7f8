-- delivery_rows (migration 0024) looks a ring claim's outcome row up by key,
-- one probe of the outcome log's primary key per claim (`OFFSET 0`, as in the
-- ring's statements: see _ring_open in queries/ring.sql), whatever the
-- statistics of the claim's day. A day analyzed while the outcome rows it
-- sampled were uncommitted is estimated at one row however many it holds, and
-- the lookup was then planned as a hash of every outcome row of the day: a
-- million read for one event's deliveries, or for whether a schedule's last
-- firings are done (1.3 s, against 10 ms). The view is otherwise unchanged.
CREATE OR REPLACE VIEW {schema}.delivery_rows AS
SELECT id, event_id, subscription_id, status, attempts, run_at, lease_until, lease_token, worker_id,
       last_error, ordering_key, replays, replayed_at, updated_at, priority_wait
FROM {schema}.deliveries
UNION ALL
SELECT r.delivery_id, r.event_id, r.subscription_id,
       CASE WHEN c.delivery_id IS NULL THEN 'pending' ELSE 'processing' END,
       CASE WHEN c.delivery_id IS NULL THEN 0 ELSE 1 END, r.enqueued_at,
       c.lease_until, c.lease_token, c.worker_id, NULL::text, NULL::text, 0, NULL::timestamptz,
       coalesce(c.claimed_at, r.enqueued_at), 0::real
FROM {schema}.ring_ready r
LEFT JOIN {schema}.ring_claims c ON c.slot = r.slot AND c.delivery_id = r.delivery_id
WHERE c.delivery_id IS NULL
   OR NOT EXISTS (SELECT 1 FROM {schema}.delivery_log l
                  WHERE l.claimed_on = (c.claimed_at AT TIME ZONE 'UTC')::date
                    AND l.delivery_id = c.delivery_id OFFSET 0)
UNION ALL
SELECT l.delivery_id, l.event_id, l.subscription_id, 'completed', 1, l.enqueued_at, NULL::timestamptz,
       NULL::uuid, l.worker_id, NULL::text, NULL::text, 0, NULL::timestamptz, l.finished_at, 0::real
FROM {schema}.delivery_log l
WHERE l.status = 'completed';
