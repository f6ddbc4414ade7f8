-- One index over the pending backlog instead of two. Since priorities every
-- delivery entered both deliveries_pending (subscription, run_at, id) and
-- deliveries_claim_order (subscription, place, run_at, id), and every claim
-- left a dead entry in both. The readers of deliveries_pending (the next due
-- time, the oldest pending figures, the backlog counts) now read
-- deliveries_claim_order, and for the earliest run_at this narrow index:
--
-- With a wait of 0 a row's place is its run_at; with a wait above 0 its place
-- is later than its run_at. So the earliest run_at of a subscription's pending
-- rows is the lesser of the first place in deliveries_claim_order and the
-- earliest run_at among rows with a wait above 0: one probe of each index.
-- A delivery of priority 0 (the default) enters this index never.
DROP INDEX {schema}.deliveries_pending;
CREATE INDEX deliveries_pending_prioritised ON {schema}.deliveries (subscription_id, run_at)
    WHERE status = 'pending' AND priority_wait > 0;
