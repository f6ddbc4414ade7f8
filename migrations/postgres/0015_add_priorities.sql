-- Priorities: lower runs first within a subscription, without starving the
-- rest. A delivery's place in the claim order is run_at plus the wait its
-- priority is worth (priority_wait, seconds: the priority times the bus's
-- priority step), so an old delivery of a low priority eventually sorts ahead
-- of fresh ones of a high priority. The place is an expression over run_at,
-- never a stored column: every write that moves run_at (a retry, a replay, a
-- workflow's hastened step) moves the place with it, and nothing else has to
-- know about priorities.

-- The priority the event was published with, for backfills of new
-- subscriptions (which compute their deliveries' wait from it) and for
-- status. Rows already in the log are priority 0. Constant defaults add the
-- columns without rewriting the tables.
ALTER TABLE {schema}.events ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE {schema}.deliveries ADD COLUMN priority_wait real NOT NULL DEFAULT 0;

-- timestamptz + interval is only STABLE (a day or a month is not a fixed
-- number of seconds in every time zone); adding a number of seconds is the
-- same in every time zone, so this function may be IMMUTABLE and indexed.
CREATE FUNCTION {schema}.claim_place(run_at timestamptz, priority_wait real)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT run_at + priority_wait * interval '1 second' $$;

-- The claim: pending rows of one subscription by their place, one range read
-- per batch. run_at is a key column so the "due now" test of a row sorted
-- ahead of its time (a delayed publish or a retry with a high priority) is
-- made on the index entry, without visiting the row. Existing pending rows
-- get place = run_at (their wait is 0), so they keep their order.
-- deliveries_pending stays: it answers "when is the next row due" and the
-- status's oldest-pending figures in run_at order.
CREATE INDEX deliveries_claim_order ON {schema}.deliveries
    (subscription_id, {schema}.claim_place(run_at, priority_wait), run_at, id)
    WHERE status = 'pending';
