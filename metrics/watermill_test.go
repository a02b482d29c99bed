package metrics_test

import (
	"context"
	"testing"
	"time"

	wmetrics "github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Watermill's own components/metrics work on the outbox: a decorated
// Publisher and Subscriber, and the router's handler metrics as forwarder
// middleware.
func TestWatermillComponentsMetricsWorkOnTheOutbox(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)
	b.Register("orders", 1)
	reg := prometheus.NewRegistry()
	builder := wmetrics.NewPrometheusMetricsBuilder(reg, "wm", "")

	pub, err := builder.DecoratePublisher(b.Publisher(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m1", []byte("x")), message.NewMessage("m2", []byte("y"))); err != nil {
		t.Fatal(err)
	}
	atLeast(t, reg, 1, "wm_publish_time_seconds", "success", "true")

	sub, err := builder.DecorateSubscriber(b.Subscriber("plain", nil))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case m := <-msgs:
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery")
		}
	}
	eventually(t, reg, 2, "wm_subscriber_messages_received_total", "acked", "acked")

	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: b.Schema, Pool: b.Pool, ConsumerGroup: "fwd", Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced(), CloseTimeout: time.Second},
		Topics:     []string{"orders"},
		Target: forwarder.TargetFunc(func(_ context.Context, _ string, batch []*message.Message) (int, error) {
			return len(batch), nil
		}),
		Middlewares: []message.HandlerMiddleware{builder.NewRouterMiddleware().Middleware},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	eventually(t, reg, 2, "wm_handler_execution_time_seconds", "success", "true")
	_ = fwd.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
