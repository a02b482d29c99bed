package pipeline_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/pipeline"
	"github.com/millrace/watermill-outbox/retention"
)

// A service's pipeline: its outbox topics forwarded to Kafka exactly once,
// poison messages in the schema's dead_letters table, a day of consumed
// messages kept for replays, the outbox's metrics on the default registry
// (package metrics), and a clean stop on SIGTERM. _examples/quickstart
// runs it with an HTTP handler.
func ExamplePipeline() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := watermill.NewStdLogger(false, false)
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	target, err := kafka.NewTarget(kafka.Config{Brokers: []string{"localhost:9092"}}, logger)
	if err != nil {
		log.Fatal(err)
	}
	defer target.Close()

	m, err := metrics.Enable(metrics.Config{Registerer: prometheus.DefaultRegisterer, Pool: pool})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Disable()

	p, err := pipeline.New(pipeline.Config{
		Pool:      pool,
		Forward:   forwarder.Config{Topics: []string{"orders", "payments"}, Target: target},
		Retention: retention.Config{KeepFor: 24 * time.Hour},
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Run(ctx); err != nil { // until SIGTERM; sends in flight finish first
		log.Fatal(err)
	}
}
