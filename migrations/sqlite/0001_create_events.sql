-- The event log, subscriptions, deliveries and attempt history (SQLite).
-- Mirrors migrations/postgres/0001_create_events.sql. Times are REAL epoch
-- seconds (UTC); booleans are 0/1; ids of workers and leases are uuid text.
-- AUTOINCREMENT keeps ids from being reused after a purge, like an identity.

-- The immutable log: written once, read at claim time, never updated.
CREATE TABLE events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_type      TEXT    NOT NULL,
    key             TEXT,
    payload         BLOB    NOT NULL,          -- msgspec JSON, decoded by the worker
    headers         TEXT    NOT NULL DEFAULT '{}',
    correlation_id  INTEGER,                   -- root event of the chain
    causation_id    INTEGER,                   -- event whose handler emitted this one
    ordering_key    TEXT,
    deliver_at      REAL    NOT NULL,
    created_at      REAL    NOT NULL,
    -- Idempotency: one event per (type, key); NULL keys never collide.
    CONSTRAINT events_type_key UNIQUE (event_type, key)
);

-- Backfill of a new subscription reads the log by type.
CREATE INDEX events_type_id ON events (event_type, id);

CREATE TABLE subscriptions (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT    NOT NULL UNIQUE,
    event_type      TEXT    NOT NULL,
    max_attempts    INTEGER NOT NULL CHECK (max_attempts >= 1),
    lease_seconds   REAL    NOT NULL CHECK (lease_seconds > 0),
    ordered         INTEGER NOT NULL DEFAULT 0 CHECK (ordered IN (0, 1)),
    created_at      REAL    NOT NULL,
    last_seen_at    REAL    NOT NULL
);

-- Publishing fans out by event type.
CREATE INDEX subscriptions_event_type ON subscriptions (event_type);

-- The hot table: narrow, updated in place, one row per (event, subscription).
CREATE TABLE deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        INTEGER NOT NULL,
    subscription_id INTEGER NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'completed', 'dead', 'cancelled')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    run_at          REAL    NOT NULL,
    lease_until     REAL,
    lease_token     TEXT,
    worker_id       TEXT,
    last_error      TEXT,
    -- Set only for subscriptions that serialise per key.
    ordering_key    TEXT,
    replays         INTEGER NOT NULL DEFAULT 0,
    replayed_at     REAL,
    updated_at      REAL    NOT NULL,
    CONSTRAINT deliveries_event_subscription UNIQUE (event_id, subscription_id)
);

-- The claim: pending rows of one subscription in run_at order. Partial, so it
-- holds only the backlog and stays small however long the history grows.
-- Queries must spell status = 'pending' literally for the planner to use it.
CREATE INDEX deliveries_pending ON deliveries (subscription_id, run_at, id)
    WHERE status = 'pending';

-- Lease recovery scans only rows being processed.
CREATE INDEX deliveries_processing ON deliveries (lease_until)
    WHERE status = 'processing';

-- Dead-letter listing by subscription and time.
CREATE INDEX deliveries_dead ON deliveries (subscription_id, updated_at)
    WHERE status = 'dead';

-- Per-key serialisation: at most one processing delivery per (subscription, key).
-- Claims run under the write lock, so this is the safety net, not the lock.
CREATE UNIQUE INDEX deliveries_one_per_key ON deliveries (subscription_id, ordering_key)
    WHERE status = 'processing' AND ordering_key IS NOT NULL;

-- Append-only history of failed attempts, so a dead delivery explains itself.
CREATE TABLE delivery_attempts (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id      INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    error_type       TEXT    NOT NULL,
    message          TEXT    NOT NULL,
    traceback        TEXT    NOT NULL DEFAULT '',
    duration_seconds REAL,
    worker_id        TEXT,
    failed_at        REAL    NOT NULL
);

CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id, id);

-- Workers report here so `eventbus status` can show who is alive and whether
-- their wake-up poller runs.
CREATE TABLE workers (
    id              TEXT    PRIMARY KEY,
    hostname        TEXT    NOT NULL,
    pid             INTEGER NOT NULL,
    started_at      REAL    NOT NULL,
    heartbeat_at    REAL    NOT NULL,
    listener_ok     INTEGER NOT NULL DEFAULT 0,
    listener_reconnects INTEGER NOT NULL DEFAULT 0
);
