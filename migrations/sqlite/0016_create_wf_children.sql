-- Child machines: a state starts runs of other machines and waits for them.
-- One row per child run of a parent run; the row is the child's outcome once
-- it ended (status, final state and checkpoint, error), so the parent reads
-- it even after the child's key starts a newer run (times are REAL epoch seconds).
CREATE TABLE wf_children (
    parent_machine text    NOT NULL,
    parent_key     text    NOT NULL,
    parent_run_id  integer NOT NULL,
    machine        text    NOT NULL,
    key            text    NOT NULL,
    run_id         integer NOT NULL,   -- rowid is the order the parent started them in
    started        INTEGER NOT NULL,   -- 0: the parent found the run live (or completed) and waits on it
    status         text,               -- NULL while the child run is live
    state          text,
    checkpoint     BLOB,
    error_code     text,
    error          text,
    linked_at      REAL    NOT NULL,
    ended_at       REAL,
    PRIMARY KEY (parent_machine, parent_key, parent_run_id, machine, key, run_id)
);

-- A child's last transition finds the parents waiting on its run.
CREATE INDEX wf_children_child ON wf_children (machine, key, run_id) WHERE status IS NULL;

-- children_ended counts the ended children of the current run; a child's end
-- increments it under the write lock, so of many children ending at once
-- exactly one sees it cross children_wait (the count a waiting parent wakes
-- at; NULL when it waits on no children) and wakes the parent.
ALTER TABLE wf_instances ADD COLUMN children_ended INTEGER NOT NULL DEFAULT 0;
ALTER TABLE wf_instances ADD COLUMN children_wait INTEGER;
