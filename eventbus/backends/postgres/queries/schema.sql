-- Migrations and statistics of the PostgreSQL backend (PgSchema). {schema} is
-- the validated, quoted schema.

-- name: analyze
-- Fresh statistics after a bulk load, so the claim plan is the steady-state one
-- (and the charts' reads of the rollup go through its minute index).
ANALYZE {schema}.deliveries, {schema}.events, {schema}.throughput_rollup;

-- name: migration_lock
-- Serialises migrations of one schema across processes. Transaction-scoped:
-- it ends with the transaction even when the caller is cancelled, whereas a
-- session lock would outlive an interrupted migrate on its pooled connection
-- (the pool does not reset sessions) and block every later migrate.
SELECT pg_advisory_xact_lock(hashtext($1));

-- name: migrations_table
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version, checksum FROM {schema}.schema_migrations;

-- name: migration_record
INSERT INTO {schema}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3);
