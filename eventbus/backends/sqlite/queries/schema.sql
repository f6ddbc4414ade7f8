-- The migration ledger of the SQLite backend (the SchemaStore port).

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    checksum   TEXT NOT NULL,
    applied_at REAL NOT NULL
);

-- name: migrations_applied
SELECT version, checksum FROM schema_migrations;

-- name: migration_record
INSERT INTO schema_migrations (version, name, checksum, applied_at)
VALUES (:version, :name, :checksum, :now);
