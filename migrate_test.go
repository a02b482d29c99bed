package outbox_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMigrateIsIdempotentAndConcurrencySafe(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = outbox.Migrate(outboxtest.Ctx(t), pool, schema)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
	}
	if err := outbox.Migrate(outboxtest.Ctx(t), pool, schema); err != nil {
		t.Fatalf("second run: %v", err)
	}
	v, err := outbox.CurrentSchemaVersion(outboxtest.Ctx(t), pool, schema)
	if err != nil || v != outbox.SchemaVersion {
		t.Fatalf("version = %d, %v; want %d", v, err, outbox.SchemaVersion)
	}
	var rows int
	if err := pool.QueryRow(outboxtest.Ctx(t), "SELECT count(*) FROM "+schema+".schema_migrations").Scan(&rows); err != nil || rows != outbox.SchemaVersion {
		t.Fatalf("schema_migrations has %d rows (%v), want one per version (%d)", rows, err, outbox.SchemaVersion)
	}
}

func TestMigrateWorksThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	if err := outbox.Migrate(outboxtest.Ctx(t), db, schema); err != nil {
		t.Fatal(err)
	}
	if v, err := outbox.CurrentSchemaVersion(outboxtest.Ctx(t), db, schema); err != nil || v != outbox.SchemaVersion {
		t.Fatalf("version = %d, %v", v, err)
	}
}

func TestMigrateRefusesNewerDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	future := outbox.SchemaVersion + 1
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+e.Schema+".schema_migrations (version, name) VALUES ($1, 'from the future')", future); err != nil {
		t.Fatal(err)
	}
	err := outbox.Migrate(outboxtest.Ctx(t), e.Pool, e.Schema)
	if !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("err = %v, want ErrSchemaTooNew", err)
	}
	var sv *outbox.SchemaVersionError
	if !errors.As(err, &sv) || sv.Database != future || sv.Library != outbox.SchemaVersion {
		t.Fatalf("err = %#v", err)
	}
	if v, _ := outbox.CurrentSchemaVersion(outboxtest.Ctx(t), e.Pool, e.Schema); v != future {
		t.Fatalf("version changed to %d", v)
	}
}

func TestUnmigratedSchemaHasVersionZero(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if v, err := outbox.CurrentSchemaVersion(outboxtest.Ctx(t), pool, pgtest.Schema(t)); err != nil || v != 0 {
		t.Fatalf("version = %d, %v; want 0", v, err)
	}
}

// Migrate gives the tables that churn their storage parameters
// (0012_churn.sql): prompt, unthrottled vacuums for the queue and the
// small tables updated all the time, room for HOT updates in the latter,
// and earlier vacuums after retention for log and bodies.
func TestMigrateSetsTheChurningTablesStorageParameters(t *testing.T) {
	t.Parallel()
	e := outboxtest.Setup(t)
	rows, err := e.Pool.Query(outboxtest.Ctx(t), `SELECT c.relname, coalesce(c.reloptions, '{}')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r'`, e.Schema)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for rows.Next() {
		var name string
		var opts []string
		if err := rows.Scan(&name, &opts); err != nil {
			t.Fatal(err)
		}
		got[name] = opts
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	prompt := func(threshold string) []string {
		return []string{"autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=" + threshold, "autovacuum_vacuum_cost_delay=0"}
	}
	hot := append([]string{"fillfactor=50"}, prompt("100")...)
	want := map[string][]string{
		"pending":    prompt("1000"),
		"partitions": hot,
		"cursors":    hot,
		"members":    hot,
		"relays":     hot,
		"log":        {"autovacuum_vacuum_scale_factor=0.02"},
		"bodies":     {"autovacuum_vacuum_scale_factor=0.02"},
		"dedup_keys": {"autovacuum_vacuum_scale_factor=0.02"},
	}
	for table, opts := range want {
		if !slices.Equal(got[table], opts) {
			t.Errorf("%s.%s: reloptions %v; want %v", e.Schema, table, got[table], opts)
		}
	}
}
