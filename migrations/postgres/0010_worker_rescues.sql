-- How many processing deliveries other workers took back from this worker
-- once it was taken for lost (its heartbeat stopped, or its process is gone):
-- shown with the worker in status until its row is pruned.
ALTER TABLE {schema}.workers ADD COLUMN rescued integer NOT NULL DEFAULT 0;

