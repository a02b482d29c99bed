package forwarder_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
)

// Forward an outbox topic through Watermill handler middleware: here a
// logging one, but metrics, tracing, correlation-id and Recoverer
// middleware plug in the same way. The target prints what it would send to
// the broker (use kafka.NewTarget or jetstream.NewTarget, of packages
// forwarder/kafka and forwarder/jetstream).
func ExampleConfig_middlewares() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	const schema = "example_forwarder"
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	if err := outbox.RegisterTopic(ctx, pool, schema, "invoices", 1); err != nil {
		panic(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		panic(err)
	}
	if err := pub.Publish("invoices", message.NewMessage("inv-1", []byte("a")), message.NewMessage("inv-2", []byte("b"))); err != nil {
		panic(err)
	}

	sent := make(chan struct{}, 2)
	logging := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			fmt.Printf("forwarded %s (%s): err=%v\n", msg.UUID, msg.Metadata.Get(outbox.MetadataID), err)
			sent <- struct{}{}
			return out, err
		}
	}
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: schema, Pool: pool},
		Topics:     []string{"invoices"},
		Target: forwarder.TargetFunc(func(_ context.Context, topic string, batch []*message.Message) (int, error) {
			fmt.Printf("send %d message(s) to %s\n", len(batch), topic)
			return len(batch), nil
		}),
		Middlewares: []message.HandlerMiddleware{logging},
	}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	defer fwd.Close()
	for range 2 {
		select {
		case <-sent:
		case <-time.After(time.Minute):
			panic("nothing forwarded")
		}
	}
	// Output:
	// send 2 message(s) to invoices
	// forwarded inv-1 (invoices/0/1): err=<nil>
	// forwarded inv-2 (invoices/0/2): err=<nil>
}
