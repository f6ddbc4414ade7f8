-- Lease recovery looks up rows by lease_until. The first index did so with the
-- predicate `status = 'processing'`, which also made it a candidate for every
-- guarded write on processing rows (complete, fail, extend, release). When the
-- statistics were stale (say "no processing rows"), the planner scanned the
-- whole partial index for each batch instead of using the primary key, and a
-- growing backlog of processing rows made each completion slower than the last.
-- lease_until is set exactly while a row is processing, so this index serves
-- recovery (`lease_until < now()` implies NOT NULL) and nothing else.
DROP INDEX {schema}.deliveries_processing;
CREATE INDEX deliveries_lease_until ON {schema}.deliveries (lease_until)
    WHERE lease_until IS NOT NULL;
