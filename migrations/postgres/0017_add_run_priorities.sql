-- A run's priority: the one its start was given (0 to 9, lower first), kept
-- on the instance so that every step of the run is published with it, not
-- only the first (a wake-up, a retry of a visit, the fan-in of its children).
-- A new run of the key takes the priority of the start that begins it. Runs
-- already stored are priority 0, as their steps were. A constant default adds
-- the column without rewriting the table.
ALTER TABLE {schema}.wf_instances ADD COLUMN priority smallint NOT NULL DEFAULT 0;
