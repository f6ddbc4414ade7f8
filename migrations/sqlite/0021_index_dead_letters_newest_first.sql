-- Dead letters newest first: the dashboard's /dead list, /deliveries?status=dead
-- and the triage page's sample read the dead rows in descending id order
-- (find_deliveries_dead, count_deliveries_dead name this index). Through
-- deliveries_dead (subscription_id, updated_at) every dead letter was read and
-- sorted for one page. Partial: a delivery has an entry only while it is dead.
CREATE INDEX deliveries_dead_newest ON deliveries (id) WHERE status = 'dead';
