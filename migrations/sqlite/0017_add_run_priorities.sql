-- A run's priority (the same change as the PostgreSQL migration of this name):
-- the one its start was given, kept on the instance so that every step of the
-- run is published with it. A new run of the key takes the priority of the
-- start that begins it. Runs already stored are priority 0.
ALTER TABLE wf_instances ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
