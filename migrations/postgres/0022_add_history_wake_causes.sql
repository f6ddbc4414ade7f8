-- What woke each visit: the reason of the step event that ran it (a signal
-- and its id, an approval and its id, a timer, a deadline, children ending,
-- a retry of the step's delivery...), so a run's timeline can say why it
-- moved on after waiting. Rows written before this migration keep NULL:
-- their cause was not recorded and is shown as unknown. Operator actions
-- (repoint, pause, cancel...) are not woken: they keep NULL too.
ALTER TABLE {schema}.wf_history ADD COLUMN woken_by text;
