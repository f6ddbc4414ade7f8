-- The shape of each machine's table (states, edges, terminals) as workers
-- recorded it at start-up, by its hash (times are REAL epoch seconds). The
-- newest registered_at is the table in force; `eventbus workflow check` and a
-- worker starting with a different table compare against it and report the
-- live instances the change touches.
CREATE TABLE wf_definitions (
    machine             text NOT NULL,
    def_hash            text NOT NULL,
    definition          text NOT NULL,   -- JSON
    first_registered_at REAL NOT NULL,
    registered_at       REAL NOT NULL,
    PRIMARY KEY (machine, def_hash)
) WITHOUT ROWID;
