-- Operators pause, resume and remove subscriptions; workers report which
-- subscriptions they serve. Mirrors migrations/postgres/0005_add_subscription_admin.sql
-- except for the owed backfills: SQLite serialises writers, so the backfill
-- inside the registering transaction already sees every committed event.

-- active: fanned out and claimed. paused: fanned out (the backlog grows) but
-- never claimed. removed: neither (its pending deliveries were cancelled).
ALTER TABLE subscriptions
    ADD COLUMN state TEXT NOT NULL DEFAULT 'active'
        CHECK (state IN ('active', 'paused', 'removed'));

-- When a worker serving the subscription last reported in; NULL: never.
ALTER TABLE subscriptions ADD COLUMN worker_seen_at REAL;
