package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/relay"
)

// walBusiness is a business table written in the same transactions as the
// messages, to check that a refused publish takes them down too.
func walBusiness(b *outboxtest.Bundle) string {
	table := b.Schema + ".business"
	b.Exec("CREATE TABLE IF NOT EXISTS " + table + " (id text PRIMARY KEY)")
	return table
}

// publishWithBusiness writes a business row id and publishes a message id
// in ModeWAL in one transaction, and commits. It returns the Publish error
// (nil when the commit succeeded) and whether the row is there afterwards.
func publishWithBusiness(t *testing.T, b *outboxtest.Bundle, id string) (publishErr error, committed bool) {
	t.Helper()
	ctx := outboxtest.Ctx(t)
	table := walBusiness(b)
	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", id); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: b.Schema, Mode: outbox.ModeWAL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	publishErr = pub.Publish("orders", message.NewMessage(id, []byte("payload of "+id)))
	commitErr := tx.Commit(ctx)
	if publishErr == nil && commitErr != nil {
		t.Fatalf("commit after a successful publish: %v", commitErr)
	}
	if publishErr != nil && commitErr == nil {
		t.Fatalf("the transaction committed after its publish failed (%v)", publishErr)
	}
	return publishErr, b.Int("SELECT count(*) FROM "+table+" WHERE id = $1", id) == 1
}

// On a server with wal_level = replica no slot can ever decode a message:
// a publish in ModeWAL fails with ErrWALLevel inside the caller's
// transaction, whose other writes then cannot commit.
func TestWALPublishFailsWithoutWALLevelLogical(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	var level string
	if err := b.Pool.QueryRow(outboxtest.Ctx(t), "SHOW wal_level").Scan(&level); err != nil || level != "replica" {
		t.Fatalf("the test server's wal_level: %q, %v; want replica", level, err)
	}
	err, committed := publishWithBusiness(t, b, "order-1")
	if !errors.Is(err, outbox.ErrWALLevel) || committed {
		t.Fatalf("publish with wal_level = replica: %v, business row committed: %v; want ErrWALLevel and no row", err, committed)
	}
	for _, want := range []string{"wal_level = logical", "restart PostgreSQL", "wal_level is replica", "transaction is aborted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	// The same through a transaction of the Publisher's own.
	own := b.Publisher(func(c *outbox.PublisherConfig) { c.Mode = outbox.ModeWAL })
	if err := own.Publish("orders", message.NewMessage("own", []byte("x"))); !errors.Is(err, outbox.ErrWALLevel) {
		t.Fatalf("OwnTransaction publish with wal_level = replica: %v, want ErrWALLevel", err)
	}
}

// On a server with wal_level = logical, a publish in ModeWAL succeeds only
// while the schema's slot exists and will decode it: before the slot is
// created, while it is being created, after it was dropped, and once it is
// invalidated, the publish fails with ErrNoSlot and takes the caller's
// other writes down with it; in between the message reaches the log.
func TestWALPublishNeedsASlotThatCanReadIt(t *testing.T) {
	t.Parallel()
	b, _ := outboxtest.OwnCluster(t, map[string]string{"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}, "walslot")
	ctx := outboxtest.Ctx(t)
	b.Register("orders", 1)

	// No slot yet.
	err, committed := publishWithBusiness(t, b, "before-slot")
	if !errors.Is(err, outbox.ErrNoSlot) || committed || !strings.Contains(err.Error(), "outbox wal create-slot") {
		t.Fatalf("publish before the slot exists: %v, business row committed: %v; want ErrNoSlot naming create-slot and no row", err, committed)
	}

	// While the slot is created. PostgreSQL lists it at once, and waits
	// for the transactions open then to end; it would not decode them.
	// Shown first with a plain logical message (probe) of such a
	// transaction, which commits while the slot waits.
	probe, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	if _, err := probe.Exec(ctx, "SELECT pg_current_xact_id(), pg_logical_emit_message(true, 'probe', 'written while the slot is created')"); err != nil {
		t.Fatal(err)
	}
	table := walBusiness(b)
	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Rollback: a no-op
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ('during-creation')"); err != nil {
		t.Fatal(err)
	}
	created := make(chan error, 1)
	go func() { created <- relay.CreateSlot(ctx, b.Pool, b.Schema) }()
	waitForSQL(t, b, "the slot to be listed while it is created",
		"SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NULL", relay.Slot(b.Schema))
	if err := probe.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: b.Schema, Mode: outbox.ModeWAL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = pub.Publish("orders", message.NewMessage("during-creation", []byte("x")))
	if !errors.Is(err, outbox.ErrNoSlot) || !strings.Contains(err.Error(), "being created") {
		t.Fatalf("publish while the slot is created: %v, want ErrNoSlot saying it is being created", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the transaction committed after its publish failed")
	}
	select {
	case err := <-created:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("CreateSlot did not return once the transactions open at its start ended")
	}
	if n := b.Int("SELECT count(*) FROM " + table); n != 0 {
		t.Fatalf("%d business rows committed", n)
	}
	if n := b.Int(`SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1::name, NULL, NULL, 'proto_version', '1', 'publication_names', $1::text, 'messages', 'true')
		WHERE position('\x70726f6265'::bytea in data) > 0`, relay.Slot(b.Schema)); n != 0 {
		t.Fatalf("the slot decodes the probe of a transaction open while it was created (%d rows): then the publish need not fail", n)
	}

	// The slot exists: the publish commits, and a relay appends it.
	if err, committed := publishWithBusiness(t, b, "with-slot"); err != nil || !committed {
		t.Fatalf("publish with the slot: %v, committed %v", err, committed)
	}
	r, err := relay.New(relay.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	waitForSQL(t, b, "the relay to append the message", "SELECT count(*) FROM "+b.Schema+".log WHERE uuid = $1", "with-slot")
	_ = r.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Publishers ran after the relay stopped: the slot is not dropped
	// unless forced, and then publishing fails again.
	if err, _ := publishWithBusiness(t, b, "unrelayed"); err != nil {
		t.Fatal(err)
	}
	var dropErr error
	deadline := time.Now().Add(30 * time.Second)
	for {
		dropErr = relay.DropSlot(ctx, b.Pool, b.Schema, false)
		if !errors.Is(dropErr, relay.ErrSlotActive) || time.Now().After(deadline) { // (the stopped relay's walsender ends a moment later)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var inUse *relay.SlotInUseError
	if !errors.As(dropErr, &inUse) || inUse.Unrelayed != 1 {
		t.Fatalf("DropSlot with a message not yet relayed: %v, want a *SlotInUseError counting 1", dropErr)
	}
	if err := relay.DropSlot(ctx, b.Pool, b.Schema, true); err != nil {
		t.Fatal(err)
	}
	err, committed = publishWithBusiness(t, b, "after-drop")
	if !errors.Is(err, outbox.ErrNoSlot) || committed {
		t.Fatalf("publish after the slot was dropped: %v, business row committed: %v; want ErrNoSlot and no row", err, committed)
	}

	// An invalidated slot (it fell behind by more than
	// max_slot_wal_keep_size) can no longer be streamed.
	b.Exec("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
	b.Exec("SELECT pg_reload_conf()")
	if err := relay.CreateSlot(ctx, b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	for i := 0; b.Int("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND wal_status = 'lost'", relay.Slot(b.Schema)) == 0; i++ {
		if i == 20 {
			t.Fatal("the slot is not invalidated")
		}
		b.Exec("INSERT INTO " + table + " (id) SELECT 'filler-' || g || '-' || pg_current_wal_lsn() FROM generate_series(1, 1000) g")
		b.Exec("SELECT pg_switch_wal()")
		b.Exec("CHECKPOINT")
	}
	err, committed = publishWithBusiness(t, b, "lost-slot")
	if !errors.Is(err, outbox.ErrNoSlot) || committed || !strings.Contains(err.Error(), "invalidated") || !strings.Contains(err.Error(), "drop-slot --force") {
		t.Fatalf("publish with an invalidated slot: %v, business row committed: %v; want ErrNoSlot saying it was invalidated", err, committed)
	}
	// Nothing in it can be read any more, so nothing to lose by dropping it.
	if err := relay.DropSlot(ctx, b.Pool, b.Schema, false); err != nil {
		t.Fatalf("DropSlot of an invalidated slot: %v", err)
	}
}

// A schema migrated before the publish statement's function existed is
// refused as not migrated, naming Migrate.
func TestWALPublishOnASchemaMigratedByAnOlderRelease(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	b.Exec("DROP FUNCTION " + b.Schema + ".wal_emit(text, text, bytea[])")
	pub := b.Publisher(func(c *outbox.PublisherConfig) { c.Mode = outbox.ModeWAL })
	err := pub.Publish("orders", message.NewMessage("m", []byte("x")))
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("publish without wal_emit: %v, want ErrNotMigrated", err)
	}
}

// waitForSQL waits until query (a count) returns at least 1.
func waitForSQL(t *testing.T, b *outboxtest.Bundle, what, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for b.Int(query, args...) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkPublishWAL measures a transaction (BEGIN, one Publish in
// ModeWAL, COMMIT) of 1 and of 100 messages of 200 bytes, on a server of
// its own with the schema's slot: the cost of the check in the publish
// statement shows against the same benchmark run on the previous release.
func BenchmarkPublishWAL(b *testing.B) {
	bundle, _ := outboxtest.OwnCluster(b, map[string]string{"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}, "walbench")
	ctx := outboxtest.Ctx(b)
	bundle.Register("orders", 4)
	if err := relay.CreateSlot(ctx, bundle.Pool, bundle.Schema); err != nil {
		b.Fatal(err)
	}
	pub := bundle.Publisher(func(c *outbox.PublisherConfig) { c.Mode = outbox.ModeWAL; c.OwnTransaction = false })
	payload := make([]byte, 200)
	for _, perTx := range []int{1, 100} {
		b.Run(fmt.Sprintf("perTx=%d", perTx), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				err := pgx.BeginFunc(ctx, bundle.Pool, func(tx pgx.Tx) error {
					txCtx := outbox.WithTx(ctx, tx)
					msgs := make([]*message.Message, perTx)
					for j := range msgs {
						msgs[j] = message.NewMessage(fmt.Sprintf("%d-%d", i, j), payload)
						msgs[j].Metadata.Set(outbox.PublishPartitionKeyMetadata, fmt.Sprint(j%16))
						msgs[j].SetContext(txCtx)
					}
					return pub.Publish("orders", msgs...)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*perTx), "us/msg")
		})
	}
}
