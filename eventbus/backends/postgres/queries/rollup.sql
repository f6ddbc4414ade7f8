-- The throughput rollup on PostgreSQL (PgRollup): inserts only. {schema} is
-- the validated, quoted schema.

-- name: rollup_record
-- One worker's counts: parallel arrays, one element per (subscription,
-- minute). The minute comes in epoch seconds; a subscription the database
-- does not know is dropped by the join. Summed by the readers, never updated.
INSERT INTO {schema}.throughput_rollup (minute, subscription_id, completed, failed, dead, durations)
SELECT to_timestamp(r.minute), s.id, r.completed, r.failed, r.dead, r.durations::jsonb
FROM unnest($1::text[], $2::float8[], $3::int[], $4::int[], $5::int[], $6::text[])
     AS r(subscription, minute, completed, failed, dead, durations)
JOIN {schema}.subscriptions s ON s.name = r.subscription;

-- name: rollup_sampled
-- Whether the minute $1 (epoch seconds) has its queue sample: one probe of
-- throughput_rollup_sample, so that only the first worker of a minute counts.
SELECT 1 FROM {schema}.throughput_rollup
WHERE minute = to_timestamp($1) AND pending IS NOT NULL
LIMIT 1;

-- name: rollup_sample
-- The queue sample of the minute $1: each active or paused subscription's
-- pending deliveries, counted no further than $2 (a bounded read of
-- deliveries_claim_order), and the age of its oldest due one (the first entry
-- of that index and of deliveries_pending_prioritised: _oldest_due, in
-- inspect.sql). A second worker's sample of the minute is refused by
-- throughput_rollup_sample and stores nothing.
INSERT INTO {schema}.throughput_rollup (minute, subscription_id, pending, lag_seconds)
SELECT to_timestamp($1), s.id,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.deliveries d
                              WHERE d.subscription_id = s.id AND d.status = 'pending'
                              LIMIT $2) b),
       extract(epoch FROM now() - {_oldest_due})::float8
FROM {schema}.subscriptions s
WHERE s.state <> 'removed'
ON CONFLICT (minute, subscription_id) WHERE pending IS NOT NULL DO NOTHING;
