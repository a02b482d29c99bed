package jetstream_test

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
)

// Forward outbox topic "orders" to the JetStream subject "orders" (a
// stream must cover it: the target creates none). Consumers read it with
// watermill-nats's JetStream subscriber; the server drops the copies a
// retry sends within the stream's duplicate window.
func ExampleNewTarget() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := watermill.NewStdLogger(false, false)
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	target, err := jetstream.NewTarget(jetstream.Config{URL: os.Getenv("NATS_URL")}, logger)
	if err != nil {
		panic(err)
	}
	defer target.Close()
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Pool: pool},
		Topics:     []string{"orders"},
		Target:     target,
	}, logger)
	if err != nil {
		panic(err)
	}
	defer fwd.Close()
	if err := fwd.Run(ctx); err != nil {
		panic(err)
	}
}
