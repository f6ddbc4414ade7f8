-- What woke each visit (the same change as the PostgreSQL migration of this
-- name): the reason of the step event that ran it. Rows written before it,
-- and operator actions, keep NULL (shown as an unknown cause).
ALTER TABLE wf_history ADD COLUMN woken_by TEXT;
