package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// SchemaVersion is the newest schema version this release knows: that of
// its last migration (internal/dbsql/migrations).
const SchemaVersion = 16

func init() { schemacheck.Latest = SchemaVersion }

// Migrate creates or upgrades the outbox tables in schema (DefaultSchema when
// empty) of the database behind db, a *pgxpool.Pool, *pgx.Conn or *sql.DB.
//
// It is idempotent and safe to run from several instances at once: the
// migrations run in one transaction under an advisory lock, and each applied
// version is recorded in schema.schema_migrations. A database migrated by a
// newer release is refused with a *outboxtype.SchemaVersionError (ErrSchemaTooNew) and
// left untouched. So is a system schema (information_schema, pg_catalog or
// any other pg_ name), with a *outboxtype.NameError (ErrInvalidName), as every entry
// point refuses it.
func Migrate[D DB](ctx context.Context, db D, schema string) error {
	return migrate(ctx, any(db), schema)
}

func migrate(ctx context.Context, db any, schema string) error {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
		return err
	}
	d, err := pgexec.FromDB(db)
	if err != nil {
		return err
	}
	// A concurrent Migrate can make this one's CREATE SCHEMA IF NOT EXISTS
	// fail with a unique violation on pg_namespace_nspname_index, even
	// though both run under the advisory lock: catalog lookups go through
	// the session's catalog cache, which keeps negative entries ("no such
	// schema", left by any earlier lookup on the same pooled connection,
	// e.g. CurrentSchemaVersion or to_regclass after the schema was
	// dropped). A session takes in other sessions' catalog changes only at
	// the start of a transaction or when it locks a relation, and waiting
	// for an advisory lock does neither: so after the other Migrate commits
	// and releases the lock, this one still believes the schema missing and
	// tries to insert it again. Its transaction then fails, and rolls back
	// whole; the next one starts by reading the catalog changes, so trying
	// again succeeds. Only unique violations on system catalogs are retried:
	// they can only come from such a race.
	for attempt := 1; ; attempt++ {
		err = migrateOnce(ctx, d, schema)
		if attempt == maxMigrateAttempts || !isCatalogRace(err) || ctx.Err() != nil {
			return err
		}
	}
}

// maxMigrateAttempts bounds the retries of a Migrate that lost a catalog
// race (one retry always suffices; more only under concurrent drops).
const maxMigrateAttempts = 5

// isCatalogRace reports a unique violation on a system catalog's index
// (pg_namespace_nspname_index, pg_class_relname_nsp_index, ...).
func isCatalogRace(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && strings.HasPrefix(pe.ConstraintName, "pg_")
}

func migrateOnce(ctx context.Context, d pgexec.DB, schema string) error {
	q := dbsql.For(schema)
	return pgexec.InTx(ctx, d, func(tx pgexec.Tx) error {
		if _, err := tx.Exec(ctx, q.CatalogLock, "watermill_outbox.migrate."+schema); err != nil {
			return fmt.Errorf("outbox: migrate: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, q.CatalogCreateSchema); err != nil {
			return fmt.Errorf("outbox: migrate: create schema: %w", err)
		}
		if _, err := tx.Exec(ctx, q.CatalogVersionTable); err != nil {
			return fmt.Errorf("outbox: migrate: version table: %w", err)
		}
		var current int
		if err := pgexec.QueryRow(ctx, tx, q.CatalogVersion, nil, &current); err != nil {
			return fmt.Errorf("outbox: migrate: read version: %w", err)
		}
		if current > SchemaVersion {
			return &outboxtype.SchemaVersionError{Schema: schema, Database: current, Library: SchemaVersion}
		}
		for _, m := range dbsql.Migrations[current:] {
			if _, err := tx.Exec(ctx, dbsql.Render(m.SQL, schema)); err != nil {
				return fmt.Errorf("outbox: migrate: version %d (%s): %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, q.CatalogRecordVersion, m.Version, m.Name); err != nil {
				return fmt.Errorf("outbox: migrate: record version %d: %w", m.Version, err)
			}
		}
		return nil
	})
}

// CurrentSchemaVersion reports the version recorded in schema, 0 when the
// outbox was never migrated there.
func CurrentSchemaVersion[D DB](ctx context.Context, db D, schema string) (int, error) {
	return currentSchemaVersion(ctx, any(db), schema)
}

func currentSchemaVersion(ctx context.Context, db any, schema string) (int, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
		return 0, err
	}
	d, err := pgexec.FromDB(db)
	if err != nil {
		return 0, err
	}
	// One statement that cannot fail on a missing schema or table, so a
	// drop between two lookups cannot surface as a raw "does not exist".
	return schemacheck.Version(ctx, d, schema)
}
