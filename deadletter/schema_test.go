package deadletter_test

import (
	"context"
	"errors"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// HandleReject, which runs in the Subscriber's transaction, refuses an
// unmigrated schema with ErrNotMigrated, and its check does not abort that
// transaction.
func TestHandleRejectRefusesAnUnmigratedSchema(t *testing.T) {
	pool := pgtest.Pool(t)
	store, err := deadletter.NewStore(deadletter.Config{Schema: pgtest.Schema(t), Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	err = store.HandleReject(ctx, tx, outboxtype.RejectedMessage{Group: "g", Topic: "t", Seq: 1, UUID: "u", Reason: errors.New("x")})
	var nm *outboxtype.NotMigratedError
	if !errors.Is(err, outbox.ErrNotMigrated) || !errors.As(err, &nm) {
		t.Fatalf("HandleReject: %v, want ErrNotMigrated", err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the check aborted the caller's transaction: %v", err)
	}
}

// A schema migrated by a newer release is refused by every operation, and
// nothing is written to it.
func TestStoreRefusesASchemaMigratedByANewerRelease(t *testing.T) {
	e := newEnv(t)
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+e.Schema+".schema_migrations (version, name) VALUES ($1, 'future')", outbox.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t) // a pool whose schema check is not cached yet
	store, err := deadletter.NewStore(deadletter.Config{Schema: e.Schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	rejected := outboxtype.RejectedMessage{Group: "g", Topic: "t", Seq: 1, UUID: "u", Reason: errors.New("x")}
	_, list := store.List(ctx, deadletter.ListOptions{})
	_, count := store.Count(ctx, deadletter.Filter{})
	_, get := store.Get(ctx, 1)
	_, replay := store.Replay(ctx, 1, deadletter.ReplayOptions{})
	_, discard := store.Discard(ctx, 1)
	_, purge := store.Purge(ctx, deadletter.PurgeOptions{})
	_, add := store.Add(ctx, rejected)
	handle := store.HandleReject(ctx, tx, rejected)
	for name, err := range map[string]error{"List": list, "Count": count, "Get": get, "Replay": replay, "Discard": discard, "Purge": purge, "Add": add, "HandleReject": handle} {
		var ve *outboxtype.SchemaVersionError
		if !errors.Is(err, outbox.ErrSchemaTooNew) || !errors.As(err, &ve) {
			t.Errorf("%s: %v, want ErrSchemaTooNew", name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".dead_letters"); n != 0 {
		t.Fatalf("%d entries written into a newer schema", n)
	}
}

// A schema dropped after the store's check was cached: the operations'
// own "does not exist" errors come back as ErrNotMigrated.
func TestStoreOnASchemaDroppedAfterTheCheck(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	if _, err := e.store.Count(ctx, deadletter.Filter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, "DROP SCHEMA "+e.Schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	_, list := e.store.List(ctx, deadletter.ListOptions{})
	_, count := e.store.Count(ctx, deadletter.Filter{})
	_, get := e.store.Get(ctx, 1)
	_, replay := e.store.Replay(ctx, 1, deadletter.ReplayOptions{})
	_, discard := e.store.Discard(ctx, 1)
	_, purge := e.store.Purge(ctx, deadletter.PurgeOptions{})
	_, add := e.store.Add(ctx, outboxtype.RejectedMessage{Group: "g", Topic: "t", UUID: "u", Reason: errors.New("x")})
	for name, err := range map[string]error{"List": list, "Count": count, "Get": get, "Replay": replay, "Discard": discard, "Purge": purge, "Add": add} {
		if !errors.Is(err, outbox.ErrNotMigrated) {
			t.Errorf("%s: %v, want ErrNotMigrated", name, err)
		}
	}
}
