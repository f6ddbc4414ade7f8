-- Ordered subscriptions are FIFO per key: the ordered claim checks each
-- candidate for an earlier live delivery of its key with one probe of this
-- index (the same change as the PostgreSQL migration of this name). Queries
-- must spell the condition literally for SQLite to use it.
CREATE INDEX deliveries_key_order ON deliveries (subscription_id, ordering_key, event_id)
    WHERE status IN ('pending', 'processing') AND ordering_key IS NOT NULL;
