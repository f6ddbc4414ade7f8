-- The audit trail: one row per operator action (dashboard or CLI) with who,
-- from where, on what, with which filter, how many rows it touched, and when
-- (the database's clock). Rows are only inserted, and deleted by retention.
CREATE TABLE {schema}.audit_log (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,   -- the operator's name
    origin    text        NOT NULL,   -- the remote address (dashboard) or user@host (CLI)
    action    text        NOT NULL,   -- replay, purge, cancel, approve, ...
    target    text        NOT NULL,   -- the subscription, machine/key, schedule or ids acted on
    filter    text,                   -- the filter used, when the action took one
    count     bigint,                 -- how many rows the action affected, when it says
    interface text        NOT NULL    -- dashboard or cli
);

-- The audit page and `eventbus audit` filtered by action, actor or both, newest
-- first, paged by keyset on id: one range read of each index.
CREATE INDEX audit_log_action ON {schema}.audit_log (action, id);
CREATE INDEX audit_log_actor ON {schema}.audit_log (actor, id);
-- Both filters at once: one operator's rows of one action.
CREATE INDEX audit_log_actor_action ON {schema}.audit_log (actor, action, id);
-- Retention walks the oldest rows by time.
CREATE INDEX audit_log_at ON {schema}.audit_log (at);
