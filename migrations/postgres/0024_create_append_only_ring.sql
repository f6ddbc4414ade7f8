-- The append-only hot path (Bus(dsn, append_only=True); see
-- eventbus/backends/postgres/ring.py for the protocol). A first attempt of an
-- unordered, undelayed delivery of priority 0 is written three times, each an
-- insert: its ready row at publish, its claim row at claim, its outcome row at
-- the end. Nothing on that path is updated or deleted: a ring slot's two
-- partitions are emptied by TRUNCATE once nothing in them is open, and a day of
-- the outcome log goes by DROP TABLE. Everything off that path (a retry, a
-- dead letter, a lease taken back, a backlog older than the ring, an ordered or
-- delayed or prioritised delivery, a backfill) lives in deliveries as before.
-- The tables exist whether or not a bus uses them; a bus without the option
-- never writes them.

-- The ring's state as a ledger: one 'open' row per generation (slot = gen % the
-- ring's size), a 'closing' row once workers must stop claiming from it, a
-- 'pruned' row once it is empty again. Never updated; one row per state change.
CREATE TABLE {schema}.ring_log (
    gen         bigint      NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('open', 'closing', 'pruned')),
    slot        smallint    NOT NULL,
    first_id    bigint      NOT NULL,   -- the delivery id sequence when the slot opened
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gen, kind)
);

-- Ready rows: one per delivery, in the slot that was open when it was published.
-- The claim reads (subscription_id, delivery_id) in order; delivery ids come
-- from deliveries' own sequence, so an id names one delivery wherever it lives.
CREATE TABLE {schema}.ring_ready (
    slot            smallint    NOT NULL,
    delivery_id     bigint      NOT NULL,
    subscription_id integer     NOT NULL,
    event_id        bigint      NOT NULL,
    enqueued_at     timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE INDEX ring_ready_claim ON {schema}.ring_ready (subscription_id, delivery_id);

-- Claims: the first fence. A claim inserts (slot, delivery_id) ON CONFLICT DO
-- NOTHING: of two claimers that both passed the anti-join, the unique index
-- lets one through. In the same slot as its ready row, so both go together.
CREATE TABLE {schema}.ring_claims (
    slot            smallint    NOT NULL,
    delivery_id     bigint      NOT NULL,
    subscription_id integer     NOT NULL,
    event_id        bigint      NOT NULL,
    lease_token     uuid        NOT NULL,
    worker_id       uuid        NOT NULL,
    lease_until     timestamptz NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    enqueued_at     timestamptz NOT NULL,
    PRIMARY KEY (slot, delivery_id)
) PARTITION BY LIST (slot);
CREATE INDEX ring_claims_lease ON {schema}.ring_claims (lease_until);

DO $$
BEGIN
    FOR k IN 0..15 LOOP
        EXECUTE format('CREATE TABLE %s.%I PARTITION OF %s.ring_ready FOR VALUES IN (%s)',
                       '{schema}', 'ring_ready_' || k, '{schema}', k);
        EXECUTE format('CREATE TABLE %s.%I PARTITION OF %s.ring_claims FOR VALUES IN (%s)',
                       '{schema}', 'ring_claims_' || k, '{schema}', k);
    END LOOP;
END $$;

INSERT INTO {schema}.ring_log (gen, kind, slot, first_id) VALUES (0, 'open', 0, 0);

-- Outcomes of ring claims: the second fence and the history of what completed
-- there. Keyed by the claim's day (UTC) and delivery id: a completion and a
-- lease taken back derive the same key from the claim row, so of the two the
-- first insert wins and the other finds the key taken. Daily partitions are
-- made ahead and dropped past the completed retention.
CREATE TABLE {schema}.delivery_log (
    claimed_on      date        NOT NULL,
    delivery_id     bigint      NOT NULL,
    subscription_id integer     NOT NULL,
    event_id        bigint      NOT NULL,
    status          text        NOT NULL
                    CHECK (status IN ('completed', 'failed', 'dead', 'lease_expired', 'worker_lost',
                                      'released', 'cancelled', 'moved')),
    worker_id       uuid,
    enqueued_at     timestamptz NOT NULL,
    claimed_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL DEFAULT now(),
    -- delivery_id first: one delivery is one probe whatever its day, and the
    -- newest outcomes come back in id order from each day's index.
    PRIMARY KEY (delivery_id, claimed_on)
) PARTITION BY RANGE (claimed_on);
-- An event's deliveries (its page, its chain, whether a schedule's firing is done).
CREATE INDEX delivery_log_event ON {schema}.delivery_log (event_id);

-- Every delivery, wherever it lives, as a row of deliveries: what the bus's
-- reads (status, lists, counts, one delivery) see when the ring is in use. A
-- ring delivery is pending (a ready row no claim took), processing (a claim
-- with no outcome yet) or completed (its outcome row); one that left the ring
-- (moved, spilled) is its deliveries row, and the ring's copy is not shown:
-- its claim has an outcome ('moved'), or it was spilled and truncated in one
-- transaction.
CREATE VIEW {schema}.delivery_rows AS
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
                    AND l.delivery_id = c.delivery_id)
UNION ALL
SELECT l.delivery_id, l.event_id, l.subscription_id, 'completed', 1, l.enqueued_at, NULL::timestamptz,
       NULL::uuid, l.worker_id, NULL::text, NULL::text, 0, NULL::timestamptz, l.finished_at, 0::real
FROM {schema}.delivery_log l
WHERE l.status = 'completed';

-- Statements on one slot's partitions or one day of the log, which name a
-- table: the table names are made here from a number or a date, never from text.
CREATE FUNCTION {schema}.ring_lock_slot(k smallint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('LOCK TABLE %s.%I, %s.%I IN ACCESS EXCLUSIVE MODE',
                   '{schema}', 'ring_ready_' || k, '{schema}', 'ring_claims_' || k);
END $$;

CREATE FUNCTION {schema}.ring_truncate_slot(k smallint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('TRUNCATE %s.%I, %s.%I',
                   '{schema}', 'ring_ready_' || k, '{schema}', 'ring_claims_' || k);
END $$;

CREATE FUNCTION {schema}.ring_analyze_slot(k smallint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ANALYZE %s.%I, %s.%I',
                   '{schema}', 'ring_ready_' || k, '{schema}', 'ring_claims_' || k);
END $$;

CREATE FUNCTION {schema}.delivery_log_make(day date) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TABLE IF NOT EXISTS %s.%I PARTITION OF %s.delivery_log '
                   'FOR VALUES FROM (%L) TO (%L)',
                   '{schema}', 'delivery_log_' || to_char(day, 'YYYYMMDD'), '{schema}', day, day + 1);
END $$;

SELECT {schema}.delivery_log_make((now() AT TIME ZONE 'UTC')::date + d) FROM generate_series(0, 2) AS d;

-- Drops the days before `before`, oldest first, at most `most` of them; returns
-- how many went. Each drop is a short ACCESS EXCLUSIVE lock on the parent too.
CREATE FUNCTION {schema}.delivery_log_drop(before date, most int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    part record;
    dropped int := 0;
BEGIN
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{schema}.delivery_log'::regclass
          AND c.relname ~ '^delivery_log_[0-9]{8}$'
          AND to_date(right(c.relname, 8), 'YYYYMMDD') < before
        ORDER BY c.relname
        LIMIT most
    LOOP
        EXECUTE format('DROP TABLE %s.%I', '{schema}', part.relname);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END $$;
