-- Recurring schedules and their occurrences (SQLite).
-- Mirrors migrations/postgres/0007_create_schedules.sql. Times are REAL epoch
-- seconds (UTC); booleans are 0/1. An occurrence is one row keyed by
-- (schedule, scheduled_for): the key makes a firing happen at most once.

CREATE TABLE schedules (
    name               TEXT    PRIMARY KEY,
    target_kind        TEXT    NOT NULL CHECK (target_kind IN ('event', 'machine')),
    target             TEXT    NOT NULL,
    cron               TEXT,
    every_seconds      REAL    CHECK (every_seconds > 0),
    anchor             REAL    NOT NULL,
    timezone           TEXT    NOT NULL DEFAULT 'UTC',
    missed             TEXT    NOT NULL CHECK (missed IN ('all', 'latest', 'skip')),
    max_catchup        INTEGER NOT NULL CHECK (max_catchup >= 1),
    overlap            TEXT    NOT NULL CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    cooldown_seconds   REAL    NOT NULL DEFAULT 0,
    jitter_seconds     REAL    NOT NULL DEFAULT 0,
    dst_gap            TEXT    NOT NULL CHECK (dst_gap IN ('shift', 'skip')),
    dst_fold           TEXT    NOT NULL CHECK (dst_fold IN ('first', 'last', 'both')),
    next_occurrence_at REAL    NOT NULL,
    next_run_at        REAL    NOT NULL,
    last_run_at        REAL,
    last_event_id      INTEGER,
    last_finished_at   REAL,
    buffered_for       REAL,
    requested          INTEGER NOT NULL DEFAULT 0 CHECK (requested IN (0, 1)),
    paused_at          REAL,
    created_at         REAL    NOT NULL,
    updated_at         REAL    NOT NULL,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);

-- The tick: due schedules in next_run_at order; paused ones only when asked to fire.
CREATE INDEX schedules_due ON schedules (next_run_at)
    WHERE paused_at IS NULL OR requested = 1;

CREATE TABLE schedule_occurrences (
    schedule      TEXT    NOT NULL,
    scheduled_for REAL    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('requested', 'buffered', 'fired',
                      'skipped_missed', 'skipped_overlap', 'skipped_dst')),
    event_id      INTEGER,
    fired_at      REAL,
    finished_at   REAL,
    recorded_at   REAL    NOT NULL,
    PRIMARY KEY (schedule, scheduled_for)
) WITHOUT ROWID;

-- Occurrences an operator asked for (trigger, backfill), read by the tick.
CREATE INDEX schedule_occurrences_requested ON schedule_occurrences (schedule, scheduled_for)
    WHERE status = 'requested';

-- Which schedules a process's code declares, content-addressed by a hash of the
-- sorted names (see the PostgreSQL migration): the tick claims only its set's.
CREATE TABLE schedule_sets (
    set_id      TEXT PRIMARY KEY,
    declared_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE schedule_declarations (
    set_id TEXT NOT NULL,
    name   TEXT NOT NULL,
    PRIMARY KEY (set_id, name)
) WITHOUT ROWID;
