-- The shape of each machine's table (states, edges, terminals) as workers
-- recorded it at start-up, by its hash. The newest registered_at is the table
-- in force; `eventbus workflow check` and a worker starting with a different
-- table compare against it and report the live instances the change touches.
CREATE TABLE {schema}.wf_definitions (
    machine             text        NOT NULL,
    def_hash            text        NOT NULL,
    definition          jsonb       NOT NULL,
    first_registered_at timestamptz NOT NULL DEFAULT now(),
    registered_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (machine, def_hash)
);
