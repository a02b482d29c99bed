package outbox_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
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
	var sv *outboxtype.SchemaVersionError
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

// Migrate upgrading a schema from before writer records
// (0015_cursor_writer.sql): the cursor rows that existed read as unknown
// writers (an older forwarder may have written their partitions under its
// per-partition transactional ids), the rows created afterwards as nobody
// yet, and recording a writer makes an old row known.
func TestMigrateLeavesTheWriterOfEarlierCursorsUnknown(t *testing.T) {
	t.Parallel()
	ctx := outboxtest.Ctx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	at := slices.IndexFunc(dbsql.Migrations, func(m dbsql.Migration) bool { return m.Name == "cursor_writer" })
	if at < 0 {
		t.Fatal("no migration cursor_writer")
	}
	// The schema as the release before writer records left it.
	q := dbsql.For(schema)
	for _, ddl := range []string{q.CatalogCreateSchema, q.CatalogVersionTable} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range dbsql.Migrations[:at] {
		if _, err := pool.Exec(ctx, dbsql.Render(m.SQL, schema)); err != nil {
			t.Fatalf("version %d: %v", m.Version, err)
		}
		if _, err := pool.Exec(ctx, q.CatalogRecordVersion, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	db, err := pgexec.FromDB(pool)
	if err != nil {
		t.Fatal(err)
	}
	s := lease.NewPGStore(db, nil, schema)
	before, after := lease.Group{Name: "before", Topic: "orders"}, lease.Group{Name: "after", Topic: "orders"}
	if err := s.CreateCursors(ctx, before, 2, false); err != nil {
		t.Fatal(err)
	}

	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if v, err := outbox.CurrentSchemaVersion(ctx, pool, schema); err != nil || v != outbox.SchemaVersion {
		t.Fatalf("version = %d, %v; want %d", v, err, outbox.SchemaVersion)
	}
	if err := s.CreateCursors(ctx, after, 2, false); err != nil {
		t.Fatal(err)
	}
	fences := func(g lease.Group) []lease.Fence {
		got, err := s.Acquire(ctx, g, "m", 2, nil, time.Minute, 2)
		if err != nil || len(got) != 2 {
			t.Fatalf("acquire %s: %+v, %v", g.Name, got, err)
		}
		var out []lease.Fence
		for _, a := range got {
			out = append(out, lease.Fence{Group: g, Partition: int(a.Partition), Member: "m", Token: a.Token})
		}
		return out
	}
	check := func(f lease.Fence, wantWriter string, wantKnown bool) {
		t.Helper()
		w, known, held, err := s.Writer(ctx, f)
		if err != nil || w != wantWriter || known != wantKnown || !held {
			t.Errorf("%s p%d: writer %q known %v held %v, %v; want %q known %v held", f.Name, f.Partition, w, known, held, err, wantWriter, wantKnown)
		}
	}
	old := fences(before)
	for _, f := range old {
		check(f, "", false)
	}
	for _, f := range fences(after) {
		check(f, "", true)
	}
	if ok, err := s.SetWriter(ctx, old[0], "outbox/m"); !ok || err != nil {
		t.Fatalf("SetWriter on an old row: %v, %v", ok, err)
	}
	check(old[0], "outbox/m", true)
	check(old[1], "", false)
	var nulls, empties int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE writer IS NULL), count(*) FILTER (WHERE writer = '') FROM %s.cursors`, schema)).Scan(&nulls, &empties); err != nil {
		t.Fatal(err)
	}
	if nulls != 1 || empties != 2 {
		t.Errorf("writer NULL on %d rows, '' on %d; want 1 and 2", nulls, empties)
	}
}

// SchemaVersion is a constant (a program cannot change it) and names the
// newest migration the release embeds.
func TestSchemaVersionIsTheNewestMigration(t *testing.T) {
	if last := dbsql.Migrations[len(dbsql.Migrations)-1].Version; outbox.SchemaVersion != last {
		t.Fatalf("SchemaVersion = %d, the newest migration is %d: set the constant to it", outbox.SchemaVersion, last)
	}
}
