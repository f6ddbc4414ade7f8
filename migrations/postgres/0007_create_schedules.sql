-- Recurring schedules and their occurrences.
-- A schedule row holds its spec, its policies and where it stands (the next
-- occurrence not yet recorded, when a tick looks next, the last firing); each
-- occurrence is one row keyed by (schedule, scheduled_for): the key is what
-- makes a firing happen at most once, whatever crashes or races.

CREATE TABLE {schema}.schedules (
    name               text        PRIMARY KEY,
    target_kind        text        NOT NULL CHECK (target_kind IN ('event', 'machine')),
    target             text        NOT NULL,
    cron               text,
    every_seconds      double precision CHECK (every_seconds > 0),
    anchor             timestamptz NOT NULL,
    timezone           text        NOT NULL DEFAULT 'UTC',
    missed             text        NOT NULL CHECK (missed IN ('all', 'latest', 'skip')),
    max_catchup        integer     NOT NULL CHECK (max_catchup >= 1),
    overlap            text        NOT NULL CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    cooldown_seconds   double precision NOT NULL DEFAULT 0,
    jitter_seconds     double precision NOT NULL DEFAULT 0,
    dst_gap            text        NOT NULL CHECK (dst_gap IN ('shift', 'skip')),
    dst_fold           text        NOT NULL CHECK (dst_fold IN ('first', 'last', 'both')),
    next_occurrence_at timestamptz NOT NULL,
    next_run_at        timestamptz NOT NULL,
    last_run_at        timestamptz,
    last_event_id      bigint,
    last_finished_at   timestamptz,
    buffered_for       timestamptz,
    requested          boolean     NOT NULL DEFAULT false,
    paused_at          timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);

-- The tick: due schedules in next_run_at order. Partial, so paused schedules
-- cost nothing unless an operator asked one to fire.
CREATE INDEX schedules_due ON {schema}.schedules (next_run_at)
    WHERE paused_at IS NULL OR requested;

CREATE TABLE {schema}.schedule_occurrences (
    schedule      text        NOT NULL,
    scheduled_for timestamptz NOT NULL,
    status        text        NOT NULL CHECK (status IN ('requested', 'buffered', 'fired',
                      'skipped_missed', 'skipped_overlap', 'skipped_dst')),
    event_id      bigint,
    fired_at      timestamptz,
    finished_at   timestamptz,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, scheduled_for)
);

-- Occurrences an operator asked for (trigger, backfill), read by the tick.
CREATE INDEX schedule_occurrences_requested ON {schema}.schedule_occurrences (schedule, scheduled_for)
    WHERE status = 'requested';

-- Which schedules a process's code declares, content-addressed by a hash of the
-- sorted names: every process running the same code shares one set. The tick
-- claims only schedules of its set (a primary-key probe per due row), so a
-- schedule removed from the code, or declared by another application on the
-- same schema, is left alone, and an idle tick sends no list of names.
CREATE TABLE {schema}.schedule_sets (
    set_id      text        PRIMARY KEY,
    declared_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.schedule_declarations (
    set_id text NOT NULL,
    name   text NOT NULL,
    PRIMARY KEY (set_id, name)
);
