-- Keys published with once=True are kept here for good: the retention pass
-- deletes events (and their keys with them) after the dedup window, never a
-- row of this table. A publish with once=True reads it before the insert, and
-- writes it in the same transaction as the event, so an event is never
-- visible without its kept key.
CREATE TABLE kept_keys (
    event_type TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    event_id   INTEGER NOT NULL,   -- the event first published with the key (it may be pruned)
    created_at REAL    NOT NULL,
    PRIMARY KEY (event_type, key)
) WITHOUT ROWID;

-- An instance a start with once=True named: its completed run is what makes
-- the next such start a no-op, so retention must keep the row while it is
-- completed (a failed or cancelled run may go: once=True starts it again).
ALTER TABLE wf_instances ADD COLUMN kept INTEGER NOT NULL DEFAULT 0;
