-- A signal belongs to one run of its instance: a late or repeated callback of
-- a finished run is never read by the next run, and a dedupe id is unique per
-- run, so run 2 may use an id that run 1 used. SQLite cannot change a
-- constraint in place: the table is rebuilt.
CREATE TABLE wf_signals_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    machine          text        NOT NULL,
    key              text        NOT NULL,
    run_id           integer     NOT NULL,
    name             text        NOT NULL,
    dedupe           text,
    payload          BLOB        NOT NULL,
    created_at       REAL        NOT NULL,
    consumed_version bigint,
    CONSTRAINT wf_signals_dedupe UNIQUE (machine, key, run_id, name, dedupe)
);

-- A consumed signal belongs to the run of the transition that consumed it;
-- an open one to the instance's current run (run 1 before the instance exists).
INSERT INTO wf_signals_new (id, machine, key, run_id, name, dedupe, payload, created_at,
                            consumed_version)
SELECT s.id, s.machine, s.key,
       COALESCE((SELECT h.run_id FROM wf_history h
                 WHERE h.machine = s.machine AND h.key = s.key AND h.version = s.consumed_version),
                (SELECT i.run_id FROM wf_instances i WHERE i.machine = s.machine AND i.key = s.key),
                1),
       s.name, s.dedupe, s.payload, s.created_at, s.consumed_version
FROM wf_signals s;

DROP TABLE wf_signals;
ALTER TABLE wf_signals_new RENAME TO wf_signals;

-- A visit reads the open signals of its run.
CREATE INDEX wf_signals_open ON wf_signals (machine, key, run_id, id) WHERE consumed_version IS NULL;
