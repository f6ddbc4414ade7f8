-- Priorities: lower runs first within a subscription, without starving the
-- rest (the same change as the PostgreSQL migration of this name). A
-- delivery's place in the claim order is run_at + priority_wait (seconds: the
-- priority times the bus's priority step), an expression over run_at, so
-- every write that moves run_at moves the place with it. Rows already in the
-- log are priority 0: their place is their run_at.
ALTER TABLE events ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deliveries ADD COLUMN priority_wait REAL NOT NULL DEFAULT 0;

-- The claim: pending rows of one subscription by their place. run_at is a key
-- column so the "due now" test is made on the index entry. Queries must spell
-- the expression and status = 'pending' literally for the planner to use it.
CREATE INDEX deliveries_claim_order ON deliveries
    (subscription_id, run_at + priority_wait, run_at, id)
    WHERE status = 'pending';
