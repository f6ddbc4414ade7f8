-- A signal belongs to one run of its instance: a late or repeated callback of
-- a finished run is never read by the next run, and a dedupe id is unique per
-- run, so run 2 may use an id that run 1 used.
ALTER TABLE {schema}.wf_signals ADD COLUMN run_id integer;

-- A consumed signal belongs to the run of the transition that consumed it;
-- an open one to the instance's current run (run 1 before the instance exists).
UPDATE {schema}.wf_signals s SET run_id = h.run_id
FROM {schema}.wf_history h
WHERE h.machine = s.machine AND h.key = s.key AND h.version = s.consumed_version;

UPDATE {schema}.wf_signals s
SET run_id = COALESCE((SELECT i.run_id FROM {schema}.wf_instances i
                       WHERE i.machine = s.machine AND i.key = s.key), 1)
WHERE s.run_id IS NULL;

ALTER TABLE {schema}.wf_signals ALTER COLUMN run_id SET NOT NULL;

ALTER TABLE {schema}.wf_signals DROP CONSTRAINT wf_signals_dedupe;
ALTER TABLE {schema}.wf_signals
    ADD CONSTRAINT wf_signals_dedupe UNIQUE (machine, key, run_id, name, dedupe);

-- A visit reads the open signals of its run.
DROP INDEX {schema}.wf_signals_open;
CREATE INDEX wf_signals_open ON {schema}.wf_signals (machine, key, run_id, id)
    WHERE consumed_version IS NULL;
