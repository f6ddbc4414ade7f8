-- Dead letters newest first: the dashboard's /dead list, /deliveries?status=dead
-- and the triage page's sample read the dead rows in descending id order.
-- deliveries_dead (subscription_id, updated_at) holds them in another order, so
-- such a read either sorted every dead letter or walked the primary key back
-- through the whole history until it met them (500,000 rows for a page when
-- the dead letters are older than the last 500,000 deliveries). Partial: a
-- delivery has an entry only while it is dead, so the claim and completion
-- paths never write it.
CREATE INDEX deliveries_dead_newest ON {schema}.deliveries (id) WHERE status = 'dead';

-- Cancelled deliveries, newest first: /deliveries?status=cancelled listed and
-- counted them by walking the whole history (a few cancelled among a million
-- completed). Cancelling is an operator's action, so the index is written
-- rarely.
CREATE INDEX deliveries_cancelled ON {schema}.deliveries (id) WHERE status = 'cancelled';
