package forwarder_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// BenchmarkForwarderMiddleware measures what running the forwarder's
// traffic through Watermill handler middleware costs: a backlog of 20,000
// keyed messages in 16 partitions is forwarded to a target that confirms
// everything at once, with no middleware and with one no-op middleware,
// side by side (run with -benchtime=1x and compare msgs/s).
func BenchmarkForwarderMiddleware(b *testing.B) {
	noop := func(h message.HandlerFunc) message.HandlerFunc { return h }
	for _, c := range []struct {
		name string
		mw   []message.HandlerMiddleware
	}{{"none", nil}, {"noop", []message.HandlerMiddleware{noop}}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				b.ReportMetric(drainThrough(b, c.mw), "msgs/s")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func drainThrough(b *testing.B, mw []message.HandlerMiddleware) float64 {
	const total, partitions = 20000, 16
	ctx := context.Background()
	bundle := outboxtest.Setup(b)
	bundle.Register("orders", partitions)
	pool, schema := bundle.Pool, bundle.Schema
	pub := bundle.Publisher(nil)
	for i := 0; i < total; i += 500 {
		batch := make([]*message.Message, 500)
		for j := range batch {
			batch[j] = message.NewMessage(watermill.NewUUID(), make([]byte, 200))
			batch[j].Metadata.Set(outbox.PublishPartitionKeyMetadata, "key-"+strconv.Itoa((i+j)%1000))
		}
		if err := pub.Publish("orders", batch...); err != nil {
			b.Fatal(err)
		}
	}
	bundle.SequenceAll()
	var forwarded atomic.Int64
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: schema, Pool: pool, Tuning: adaptive.Default(), CloseTimeout: time.Second},
		Topics:     []string{"orders"},
		Target: forwarder.TargetFunc(func(_ context.Context, _ string, batch []*message.Message) (int, error) {
			forwarded.Add(int64(len(batch)))
			return len(batch), nil
		}),
		Middlewares: mw,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	for forwarded.Load() < total {
		time.Sleep(time.Millisecond)
	}
	took := time.Since(start)
	_ = fwd.Close()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return total / took.Seconds()
}
