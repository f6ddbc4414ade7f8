-- How many processing deliveries other workers took back from this worker
-- once it was taken for lost (its heartbeat stopped, or its process is gone):
-- shown with the worker in status until its row is pruned.
ALTER TABLE workers ADD COLUMN rescued integer NOT NULL DEFAULT 0;

-- The rescue looks up a lost worker's processing deliveries by worker.
CREATE INDEX deliveries_processing_worker ON deliveries (worker_id)
    WHERE status = 'processing';
