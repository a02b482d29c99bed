package outbox_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Publish two messages in the caller's transaction, sequence them, and read
// them back with a Subscriber of the "billing" group.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	const schema = "example_outbox"
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	if err := outbox.RegisterTopic(ctx, pool, schema, "orders", 4); err != nil {
		panic(err)
	}

	// A long-lived publisher, injected into handlers.
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	for _, event := range []string{"created", "paid"} {
		msg := message.NewMessage("order-42-"+event, []byte(event))
		msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, "order-42")
		msg.SetContext(outbox.WithTx(ctx, tx)) // the handler's own transaction
		if err := pub.Publish("orders", msg); err != nil {
			panic(err)
		}
	}
	if err := tx.Commit(ctx); err != nil { // stored if and only if this commits
		panic(err)
	}

	// The subscriber runs a sequencer of its own unless told not to.
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "billing"}, nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	for i := 0; i < 2; i++ {
		select {
		case m := <-msgs:
			fmt.Println(string(m.Payload), m.Metadata.Get(outbox.MetadataSeq), m.Metadata.Get(outbox.MetadataID))
			m.Ack()
		case <-time.After(time.Minute):
			fmt.Println("timed out")
		}
	}
	// Output:
	// created 1 orders/0/1
	// paid 2 orders/0/2
}

// A custom partition key: messages of one customer stay in order.
func ExamplePublisherConfig_partitionKeyFunc() {
	cfg := outbox.PublisherConfig{
		PartitionKeyFunc: func(topic string, msg *message.Message) (string, error) {
			return msg.Metadata.Get("customer_id"), nil
		},
	}
	fmt.Println(cfg.Validate())
	// Output: <nil>
}

// The stable id of a message: the same on every redelivery.
func ExampleStableID() {
	fmt.Println(outbox.StableID("orders", 3, 42))
	// Output: orders/3/42
}

// Key isolation: a message that fails holds back only the later messages of
// its own key; the rest of the partition keeps flowing. Bounds per
// partition keep it from holding without limit (past them the partition
// blocks as without isolation, and says so).
func ExampleKeyIsolation() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema:        "example_outbox",
		Pool:          pool,
		ConsumerGroup: "billing",
		MaxAttempts:   10,
		RejectHandler: outboxtype.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
			return nil // e.g. a deadletter.Store
		}),
		KeyIsolation: outbox.KeyIsolation{Enabled: true, MaxHeldKeys: 50},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	for m := range msgs {
		// A Nack holds this message's key back; other customers' orders go on.
		m.Ack()
	}
}
