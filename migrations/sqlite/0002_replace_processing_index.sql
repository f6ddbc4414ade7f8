-- Lease recovery looks up rows by lease_until. The first index did so with the
-- predicate `status = 'processing'`, which also made it a candidate for every
-- guarded write on processing rows; lease_until is set exactly while a row is
-- processing, so this index serves recovery and nothing else (the same change
-- as the PostgreSQL migration of this name).
DROP INDEX deliveries_processing;
CREATE INDEX deliveries_lease_until ON deliveries (lease_until)
    WHERE lease_until IS NOT NULL;
