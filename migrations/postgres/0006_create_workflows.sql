-- Durable state machines: one pointer row per (machine, key), an append-only
-- history (one row per visit or operator action), signals, approvals and the
-- compensation ledger. Every pointer write is guarded by `version`, the
-- fencing token of the instance, bumped by every committed transition.

CREATE TABLE {schema}.wf_instances (
    machine          text        NOT NULL,
    key              text        NOT NULL,
    run_id           integer     NOT NULL DEFAULT 1,
    state            text        NOT NULL,
    status           text        NOT NULL
                     CHECK (status IN ('pending', 'running', 'waiting', 'waiting_approval', 'paused',
                                       'completed', 'failed', 'cancelled', 'uncertain')),
    version          bigint      NOT NULL DEFAULT 1,
    visits           text        NOT NULL DEFAULT '{}',   -- JSON: state -> visits in this run
    attempts         integer     NOT NULL DEFAULT 0,      -- failed tries of the current compensation
    checkpoint       bytea       NOT NULL,                -- msgspec JSON of the typed checkpoint
    last_error_code  text,
    last_error       text,
    held_state       text,        -- where paused/uncertain/compensating instances return to
    compensate_to      text,        -- the terminal state a compensation ends in
    next_run_at      timestamptz, -- when the next step is due (NULL: waiting for the world)
    state_entered_at timestamptz NOT NULL DEFAULT now(),
    run_started_at   timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (machine, key)
) WITH (fillfactor = 80);

-- `workflow list --status/--state` and the live diagram's counts.
CREATE INDEX wf_instances_status ON {schema}.wf_instances (machine, status, state);

-- The sweep for lost ticks looks only at instances with a due step.
CREATE INDEX wf_instances_due ON {schema}.wf_instances (next_run_at) WHERE next_run_at IS NOT NULL;

-- Append-only: one row per committed transition, so (machine, key, version) is unique.
CREATE TABLE {schema}.wf_history (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine      text        NOT NULL,
    key          text        NOT NULL,
    run_id       integer     NOT NULL,
    version      bigint      NOT NULL,     -- the version this transition committed
    state        text        NOT NULL,
    visit        integer     NOT NULL,
    outcome      text        NOT NULL,
    next_state   text        NOT NULL,
    yielded      boolean     NOT NULL DEFAULT false,
    error_code   text,
    error        text,
    actor        text        NOT NULL,
    reason       text,
    delivery_id  bigint,
    started_at   timestamptz NOT NULL DEFAULT now(),
    at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT wf_history_version UNIQUE (machine, key, version)
);

-- Durable signals, kept until a transition consumes them; dedupe per (instance, name, id).
CREATE TABLE {schema}.wf_signals (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine          text        NOT NULL,
    key              text        NOT NULL,
    name             text        NOT NULL,
    dedupe           text,
    payload          bytea       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    consumed_version bigint,
    CONSTRAINT wf_signals_dedupe UNIQUE (machine, key, name, dedupe)
);

CREATE INDEX wf_signals_open ON {schema}.wf_signals (machine, key, id) WHERE consumed_version IS NULL;

-- Approvals: tied to a hash of the exact input, decided once, expiring.
CREATE TABLE {schema}.wf_approvals (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine          text        NOT NULL,
    key              text        NOT NULL,
    run_id           integer     NOT NULL,
    state            text        NOT NULL,
    input            bytea       NOT NULL,
    input_hash       text        NOT NULL,
    status           text        NOT NULL
                     CHECK (status IN ('pending', 'approved', 'denied', 'expired',
                                       'superseded')),
    requested_at     timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    decided_by       text,
    decided_at       timestamptz,
    reason           text,
    consumed_version bigint
);

CREATE INDEX wf_approvals_instance ON {schema}.wf_approvals (machine, key, run_id, state);

-- The compensation ledger: irreversible effects recorded with their transition.
CREATE TABLE {schema}.wf_effects (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine      text        NOT NULL,
    key          text        NOT NULL,
    run_id       integer     NOT NULL,
    state        text        NOT NULL,
    op_key       text        NOT NULL,
    kind         text        NOT NULL,
    ref          text        NOT NULL DEFAULT '{}',
    compensation text,
    status       text        NOT NULL DEFAULT 'done'
                 CHECK (status IN ('done', 'compensated', 'uncertain')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX wf_effects_run ON {schema}.wf_effects (machine, key, run_id, id);
