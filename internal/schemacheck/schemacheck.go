// Package schemacheck makes every entry point of the outbox refuse a schema
// it cannot work with, with a typed error instead of a raw SQL one: a schema
// that was never migrated (sentinel.ErrNotMigrated, naming outbox.Migrate) and
// one migrated by a newer release (sentinel.ErrSchemaTooNew).
//
// Check reads the schema's version once per database handle and schema and
// caches a success, so that it costs one query per process, not per call;
// Wrap turns the "relation does not exist" errors of a schema dropped later
// into the same typed error.
package schemacheck

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Latest is the newest schema version this release knows; the root package
// sets it from its embedded migrations at init.
var Latest int

type key struct {
	db     any
	schema string
}

var checked sync.Map // key -> struct{}

// Check returns nil when schema, reached through q, is migrated to a
// version this release knows, a *outboxtype.NotMigratedError when it holds no
// outbox tables, and a *outboxtype.SchemaVersionError when it was migrated by a
// newer release. handle identifies the database (e.g. the *pgxpool.Pool)
// for the cache; nil disables caching.
func Check(ctx context.Context, handle any, q pgexec.Querier, schema string) error {
	k := key{db: handle, schema: schema}
	if handle != nil {
		if _, ok := checked.Load(k); ok {
			return nil
		}
	}
	v, err := Version(ctx, q, schema)
	if err != nil {
		return err
	}
	switch {
	case v == 0:
		return &outboxtype.NotMigratedError{Schema: schema}
	case Latest > 0 && v > Latest:
		return &outboxtype.SchemaVersionError{Schema: schema, Database: v, Library: Latest}
	}
	if handle != nil {
		checked.Store(k, struct{}{})
	}
	return nil
}

// CheckPool is Check through a connection pool, which is also the cache
// key.
func CheckPool(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	db, err := pgexec.FromDB(pool)
	if err != nil {
		return err
	}
	return Check(ctx, pool, db, schema)
}

// Forget drops the cached result for handle and schema (after the schema
// was dropped or migrated again, e.g. in tests).
func Forget(handle any, schema string) { checked.Delete(key{db: handle, schema: schema}) }

// Version reads the version recorded in schema, 0 when the outbox was never
// migrated there.
//
// It is one statement that cannot fail on a missing schema or table (the
// version table is read through query_to_xml only when it exists), so it
// is safe inside a caller's transaction: it never aborts it.
func Version(ctx context.Context, q pgexec.Querier, schema string) (int, error) {
	var v int
	if err := pgexec.QueryRow(ctx, q, dbsql.For(schema).CatalogCheckVersion, []any{names.Quote(schema) + ".schema_migrations"}, &v); err != nil {
		return 0, fmt.Errorf("outbox: reading the schema version of %q: %w", schema, err)
	}
	return v, nil
}

// Wrap returns err, or a *outboxtype.NotMigratedError wrapping it when it says
// that a table or the schema does not exist (SQLSTATE 42P01, 3F000): the
// schema was never migrated or was dropped since.
func Wrap(err error, schema string) error {
	if IsUndefined(err) {
		var nm *outboxtype.NotMigratedError
		if errors.As(err, &nm) {
			return err
		}
		return &outboxtype.NotMigratedError{Schema: schema, Cause: err}
	}
	return err
}

// IsUndefined reports whether err is PostgreSQL's undefined_table (42P01)
// or invalid_schema_name (3F000).
func IsUndefined(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000")
}
