package queuevacuum_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/internal/queuevacuum"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// churn inserts n rows into schema's pending table and deletes them, as
// publishers and the sequencer do, with autovacuum off for the table so
// that only the Vacuumer can clear them.
func churn(t *testing.T, pool *pgxpool.Pool, schema string, n int) {
	t.Helper()
	ctx := outboxtest.Ctx(t)
	table := pgx.Identifier{schema, "pending"}.Sanitize()
	for _, stmt := range []string{
		"ALTER TABLE " + table + " SET (autovacuum_enabled = false)",
		"INSERT INTO " + table + " (topic, partition, uuid, metadata, payload) SELECT 't', 0, g::text, '{}', '\\x00' FROM generate_series(1, " + fmt.Sprint(n) + ") g",
		"DELETE FROM " + table,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
}

// deadRows is pending's n_dead_tup once the statistics caught up with
// what this session did.
func deadRows(t *testing.T, pool *pgxpool.Pool, schema string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(outboxtest.Ctx(t), `SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'pending'`, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func migrated(t *testing.T) (*pgxpool.Pool, string) {
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	if err := outbox.Migrate(outboxtest.Ctx(t), pool, schema); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

// Below Every rows moved nothing happens; past it, one vacuum clears the
// dead rows; the next is not before MinGap.
func TestVacuumsPendingOnceEveryRowsMoved(t *testing.T) {
	pool, schema := migrated(t)
	churn(t, pool, schema, 3000)
	v := queuevacuum.NewWith(pool, schema, nil, 2500, time.Hour)
	ctx := outboxtest.Ctx(t)

	v.Moved(ctx, 2000)
	v.Wait()
	if n := v.Vacuums(); n != 0 {
		t.Fatalf("after 2,000 of 2,500 rows: %d vacuums", n)
	}
	outboxtest.WaitFor(t, "the statistics to count pending's dead rows", 10*time.Second, func() bool { return deadRows(t, pool, schema) >= 3000 })

	v.Moved(ctx, 1000)
	v.Wait()
	if n := v.Vacuums(); n != 1 {
		t.Fatalf("after 3,000 rows: %d vacuums; want 1", n)
	}
	outboxtest.WaitFor(t, "pending's dead rows to be gone", 10*time.Second, func() bool { return deadRows(t, pool, schema) == 0 })
	// The small tables updated all the time go with it.
	for _, table := range []string{"partitions", "cursors"} {
		outboxtest.WaitFor(t, table+" vacuumed", 10*time.Second, func() bool {
			var n int64
			if err := pool.QueryRow(ctx, `SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n >= 1
		})
	}

	v.Moved(ctx, 5000) // due by rows, but within MinGap of the last
	v.Wait()
	if n := v.Vacuums(); n != 1 {
		t.Fatalf("within MinGap: %d vacuums; want still 1", n)
	}
}

// A role that does not own pending does not vacuum it (VACUUM would skip
// the table with a warning nobody sees): it asks once and stops.
func TestLeavesPendingToAutovacuumWithoutOwnership(t *testing.T) {
	owner, schema := migrated(t)
	churn(t, owner, schema, 3000)
	ctx := outboxtest.Ctx(t)
	role := "qv_" + schema
	for _, stmt := range []string{
		"CREATE ROLE " + pgx.Identifier{role}.Sanitize(),
		"GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + pgx.Identifier{role}.Sanitize(),
	} {
		if _, err := owner.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = owner.Exec(ctx, "REVOKE ALL ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" FROM "+pgx.Identifier{role}.Sanitize())
		_, _ = owner.Exec(ctx, "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize())
		return err
	}
	other, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	v := queuevacuum.NewWith(other, schema, nil, 1000, 0)
	v.Moved(ctx, 3000)
	v.Wait()
	v.Moved(ctx, 3000)
	v.Wait()
	if n := v.Vacuums(); n != 0 {
		t.Fatalf("a role that does not own pending ran %d vacuums", n)
	}
	outboxtest.WaitFor(t, "the statistics to count pending's dead rows", 10*time.Second, func() bool { return deadRows(t, owner, schema) >= 3000 })
}
