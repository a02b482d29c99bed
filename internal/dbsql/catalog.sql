-- The schema's own bookkeeping: migrations and their version table.

-- name: CatalogLock
-- Serializes concurrent migrations of one schema across instances, until
-- the transaction ends. $1 the lock's name.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- name: CatalogCreateSchema
CREATE SCHEMA IF NOT EXISTS {{schema}};

-- name: CatalogVersionTable
CREATE TABLE IF NOT EXISTS {{schema}}.schema_migrations (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now());

-- name: CatalogVersion
-- The version applied last, 0 for none, inside the migration's transaction.
SELECT coalesce(max(version), 0) FROM {{schema}}.schema_migrations;

-- name: CatalogRecordVersion
-- $1 version, $2 name.
INSERT INTO {{schema}}.schema_migrations (version, name) VALUES ($1, $2);

-- name: CatalogCheckVersion
-- The schema's version, 0 when never migrated. One statement that cannot
-- fail on a missing schema or table (the version table is read through
-- query_to_xml only when it exists), so it is safe inside a caller's
-- transaction: it never aborts it. $1 the quoted name of the version table.
SELECT CASE WHEN to_regclass($1::text) IS NULL THEN 0 ELSE coalesce((xpath('/row/v/text()',
	query_to_xml(format('SELECT max(version) AS v FROM %s', to_regclass($1::text)), false, true, '')))[1]::text::int, 0) END;

-- name: CatalogNow
-- The database clock: the start of the transaction.
SELECT now();

-- name: CatalogNowMinus
-- The database clock less $1 µs.
SELECT now() - $1::int8 * interval '1 microsecond';

-- name: CatalogDropSchema
-- Drops the schema and everything in it (outboxtest.Schema's cleanup).
DROP SCHEMA IF EXISTS {{schema}} CASCADE;
