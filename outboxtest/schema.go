package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// Schema creates a schema of its own for t on an existing database (db: a
// *pgxpool.Pool or *sql.DB), migrates the outbox into it and drops it,
// with everything in it, when the test ends. Tests that each use their own
// schema can run in parallel on one database without seeing each other's
// messages, cursors or dead letters. Pass the name to every config's
// Schema (and to the Require functions with InSchema).
func Schema[D outbox.DB](t testing.TB, db D) string {
	t.Helper()
	d, err := pgexec.FromDB(any(db))
	if err != nil {
		t.Fatalf("outboxtest.Schema: %v", err)
		return ""
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "outboxtest_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := outbox.Migrate(ctx, db, name); err != nil {
		t.Fatalf("outboxtest.Schema: migrate %s: %v", name, err)
		return ""
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := d.Exec(ctx, dbsql.For(name).CatalogDropSchema); err != nil {
			t.Errorf("outboxtest.Schema: drop %s: %v", name, err)
		}
	})
	return name
}
