package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

var migrations = mustLoadMigrations()

// SchemaVersion is the newest schema version this release knows.
var SchemaVersion = migrations[len(migrations)-1].version

func init() { schemacheck.Latest = SchemaVersion }

func mustLoadMigrations() []migration {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	var out []migration
	for _, e := range entries {
		prefix, rest, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			panic("outbox: bad migration file name " + e.Name())
		}
		body, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, migration{version: v, name: strings.TrimSuffix(rest, ".sql"), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			panic(fmt.Sprintf("outbox: migration versions must be 1..n, found %d at position %d", m.version, i+1))
		}
	}
	return out
}

// Migrate creates or upgrades the outbox tables in schema (DefaultSchema when
// empty) of the database behind db, a *pgxpool.Pool, *pgx.Conn or *sql.DB.
//
// It is idempotent and safe to run from several instances at once: the
// migrations run in one transaction under an advisory lock, and each applied
// version is recorded in schema.schema_migrations. A database migrated by a
// newer release is refused with a *SchemaVersionError (ErrSchemaTooNew) and
// left untouched. So is a system schema (information_schema, pg_catalog or
// any other pg_ name), with a *NameError (ErrInvalidName), as every entry
// point refuses it.
func Migrate(ctx context.Context, db any, schema string) error {
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
	q := names.Quote(schema)
	return pgexec.InTx(ctx, d, func(tx pgexec.Tx) error {
		// Serialize concurrent migrations of this schema across instances.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "watermill_outbox.migrate."+schema); err != nil {
			return fmt.Errorf("outbox: migrate: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+q); err != nil {
			return fmt.Errorf("outbox: migrate: create schema: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+`.schema_migrations (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("outbox: migrate: version table: %w", err)
		}
		var current int
		if err := pgexec.QueryRow(ctx, tx, "SELECT coalesce(max(version), 0) FROM "+q+".schema_migrations", nil, &current); err != nil {
			return fmt.Errorf("outbox: migrate: read version: %w", err)
		}
		if current > SchemaVersion {
			return &errs.SchemaVersionError{Schema: schema, Database: current, Library: SchemaVersion}
		}
		for _, m := range migrations[current:] {
			if _, err := tx.Exec(ctx, strings.ReplaceAll(m.sql, "{{schema}}", q)); err != nil {
				return fmt.Errorf("outbox: migrate: version %d (%s): %w", m.version, m.name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+q+".schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
				return fmt.Errorf("outbox: migrate: record version %d: %w", m.version, err)
			}
		}
		return nil
	})
}

// CurrentSchemaVersion reports the version recorded in schema, 0 when the
// outbox was never migrated there.
func CurrentSchemaVersion(ctx context.Context, db any, schema string) (int, error) {
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
