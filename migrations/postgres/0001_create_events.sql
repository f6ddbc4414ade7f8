-- The event log, subscriptions, deliveries and attempt history.
-- {schema} is replaced by the validated, quoted schema name.

-- The immutable log: written once, read at claim time, never updated.
CREATE TABLE {schema}.events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type      text        NOT NULL,
    key             text,
    payload         bytea       NOT NULL,      -- msgspec JSON, decoded by the worker
    headers         jsonb       NOT NULL DEFAULT '{}',
    correlation_id  bigint,                    -- root event of the chain
    causation_id    bigint,                    -- event whose handler emitted this one
    ordering_key    text,
    deliver_at      timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- Idempotency: one event per (type, key); NULL keys never collide.
    CONSTRAINT events_type_key UNIQUE (event_type, key)
);

-- Backfill of a new subscription reads the log by type.
CREATE INDEX events_type_id ON {schema}.events (event_type, id);

CREATE TABLE {schema}.subscriptions (
    id              integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text        NOT NULL UNIQUE,
    event_type      text        NOT NULL,
    max_attempts    integer     NOT NULL CHECK (max_attempts >= 1),
    lease_seconds   double precision NOT NULL CHECK (lease_seconds > 0),
    ordered         boolean     NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now()
);

-- Publishing fans out by event type.
CREATE INDEX subscriptions_event_type ON {schema}.subscriptions (event_type);

-- The hot table: narrow, updated in place, one row per (event, subscription).
-- fillfactor leaves room on each page so status updates stay HOT.
CREATE TABLE {schema}.deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        bigint      NOT NULL,
    subscription_id integer     NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'completed', 'dead', 'cancelled')),
    attempts        integer     NOT NULL DEFAULT 0,
    run_at          timestamptz NOT NULL DEFAULT now(),
    lease_until     timestamptz,
    lease_token     uuid,
    worker_id       uuid,
    last_error      text,
    -- Set only for subscriptions that serialise per key.
    ordering_key    text,
    replays         integer     NOT NULL DEFAULT 0,
    replayed_at     timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT deliveries_event_subscription UNIQUE (event_id, subscription_id)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05);

-- The claim: pending rows of one subscription in run_at order. Partial, so it
-- holds only the backlog and stays small however long the history grows.
CREATE INDEX deliveries_pending ON {schema}.deliveries (subscription_id, run_at, id)
    WHERE status = 'pending';

-- Lease recovery scans only rows being processed.
CREATE INDEX deliveries_processing ON {schema}.deliveries (lease_until)
    WHERE status = 'processing';

-- Dead-letter listing by subscription and time.
CREATE INDEX deliveries_dead ON {schema}.deliveries (subscription_id, updated_at)
    WHERE status = 'dead';

-- Per-key serialisation: at most one processing delivery per (subscription, key).
CREATE UNIQUE INDEX deliveries_one_per_key ON {schema}.deliveries (subscription_id, ordering_key)
    WHERE status = 'processing' AND ordering_key IS NOT NULL;

-- Append-only history of failed attempts, so a dead delivery explains itself.
CREATE TABLE {schema}.delivery_attempts (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id      bigint      NOT NULL,
    attempt          integer     NOT NULL,
    error_type       text        NOT NULL,
    message          text        NOT NULL,
    traceback        text        NOT NULL DEFAULT '',
    duration_seconds double precision,
    worker_id        uuid,
    failed_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX delivery_attempts_delivery ON {schema}.delivery_attempts (delivery_id, id);

-- Workers report here so `eventbus status` can show who is alive and how the
-- LISTEN connection fares.
CREATE TABLE {schema}.workers (
    id              uuid        PRIMARY KEY,
    hostname        text        NOT NULL,
    pid             integer     NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    listener_ok     boolean     NOT NULL DEFAULT false,
    listener_reconnects integer NOT NULL DEFAULT 0
);
