package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
)

// Publish a payment's event once per client request: a retried request
// carries the same idempotency key, and the event of the retry is not
// stored. Publish returns nil for it; Deduplicated says it was left out,
// and the handler can roll back its own writes for the repeat.
func ExampleDedupKey() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	const schema = "example_dedup"
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	if err := outbox.RegisterTopic(ctx, pool, schema, "payments", 4); err != nil {
		panic(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{
		Schema:       schema,
		DedupWindows: map[string]time.Duration{"payments": time.Hour}, // other topics: DedupWindow, 24 hours
	}, nil)
	if err != nil {
		panic(err)
	}

	requestID := watermill.NewUUID() // the client's idempotency key, the same on every retry
	for attempt := 1; attempt <= 2; attempt++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount_cents":1250}`))
			if err := outbox.DedupKey(msg, "payment-request/"+requestID); err != nil {
				return err
			}
			msg.SetContext(outbox.WithTx(ctx, tx))
			if err := pub.Publish("payments", msg); err != nil {
				return err
			}
			fmt.Printf("attempt %d: deduplicated %v\n", attempt, outbox.Deduplicated(msg))
			return nil
		})
		if err != nil {
			panic(err)
		}
	}

	// An empty key is refused.
	fmt.Println(errors.Is(outbox.DedupKey(message.NewMessage("m", nil), ""), outbox.ErrInvalidArgument))
	// Output:
	// attempt 1: deduplicated false
	// attempt 2: deduplicated true
	// true
}
