-- Ordered subscriptions are FIFO per key: the head of a key is its earliest
-- delivery by event order that is still pending or processing, and only the
-- head may be claimed. The ordered claim checks each candidate for an earlier
-- live delivery of its key; this index answers that with one range probe.
-- Only keyed rows (ordered subscriptions) in a live state are in it, so
-- unordered subscriptions and the completed history add nothing to it.
CREATE INDEX deliveries_key_order ON {schema}.deliveries (subscription_id, ordering_key, event_id)
    WHERE status IN ('pending', 'processing') AND ordering_key IS NOT NULL;
