-- Operators pause, resume and remove subscriptions; workers report which
-- subscriptions they serve; a new subscription's backfill is owed durably.
-- {schema} is replaced by the validated, quoted schema name.

-- active: fanned out and claimed. paused: fanned out (the backlog grows) but
-- never claimed. removed: neither (its pending deliveries were cancelled).
ALTER TABLE {schema}.subscriptions
    ADD COLUMN state text NOT NULL DEFAULT 'active'
        CHECK (state IN ('active', 'paused', 'removed'));

-- When a worker serving the subscription last reported in; NULL: never.
ALTER TABLE {schema}.subscriptions ADD COLUMN worker_seen_at timestamptz;

-- A backfill still owed to a new subscription. A publish whose snapshot was
-- taken before the subscription committed fans out without it, and the first
-- backfill cannot see that event until its transaction commits. The row stays
-- until every transaction that may have published so has ended, then a last,
-- idempotent backfill runs and the row goes. registered_xid: the registering
-- transaction; open_vxids: the virtual transaction ids (held by every
-- transaction, xid or not) of those transactions, read once the registration
-- committed; open_xids: the xids they had then, and those of prepared
-- transactions (a transaction that prepares releases its vxid, not its xid).
CREATE TABLE {schema}.subscription_backfills (
    subscription_id integer     PRIMARY KEY,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    registered_xid  xid8        NOT NULL,
    open_vxids      text[],
    open_xids       text[]
);
