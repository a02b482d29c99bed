package relay_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/relay"
)

// The log-based mode end to end: create the slot once, publish into the
// WAL in the caller's transaction, and run a relay, which appends the
// messages to the log where Subscribers and Forwarders read them.
// (DATABASE_URL names a server with wal_level = logical and a role with
// REPLICATION.)
func ExampleRelay() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	const schema = "example_wal"
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	if err := outbox.RegisterTopic(ctx, pool, schema, "orders", 4); err != nil {
		log.Fatal(err)
	}
	// Once, like Migrate. From here on PostgreSQL keeps the WAL a relay has
	// not read: keep a relay running, or DropSlot.
	if err := relay.CreateSlot(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	defer relay.DropSlot(ctx, pool, schema, false) //nolint:errcheck // an example's cleanup

	// Publish in a transaction, as in table mode: only Mode differs.
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, Mode: outbox.ModeWAL}, nil)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	msg := message.NewMessage("order-1", []byte(`{"order_id":1}`))
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, "customer-7")
	msg.SetContext(outbox.WithTx(ctx, tx))
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	// The relay; in a service, run one per instance (the others wait as
	// standbys) until shutdown.
	r, err := relay.New(relay.Config{Schema: schema, Pool: pool}, nil)
	if err != nil {
		log.Fatal(err)
	}
	go r.Run(ctx) //nolint:errcheck // Close ends it
	defer r.Close()
	for r.Stats().Appended < 1 {
		time.Sleep(10 * time.Millisecond)
	}
	var seq int64
	if err := pool.QueryRow(ctx, `SELECT seq FROM example_wal.log WHERE uuid = 'order-1'`).Scan(&seq); err != nil {
		log.Fatal(err)
	}
	fmt.Println("order-1 is in the log with seq", seq)
	// Output: order-1 is in the log with seq 1
}
