-- The retention walks over what schedules and state machines leave behind
-- read their rows oldest first, a bounded range of an index per batch.

-- Past occurrences by their time (the walk's cursor is (scheduled_for, schedule)).
CREATE INDEX schedule_occurrences_age ON schedule_occurrences (scheduled_for, schedule);

-- Finished instances by when they finished. Partial: a live instance has no
-- entry, so transitions pay for it only when they finish a run.
CREATE INDEX wf_instances_finished ON wf_instances (updated_at, machine, key)
    WHERE status IN ('completed', 'failed', 'cancelled');
