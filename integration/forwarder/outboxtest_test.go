package forwarder_test

import (
	"context"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	apptest "github.com/millrace/watermill-outbox/outboxtest"
)

// A test of an application's forwarding drives the Forwarder's own handler
// with outboxtest: when RunUntilIdle returns, everything committed is at
// the broker (a transaction committed per batch, exactly once), in key
// order, and no goroutine of the run is left.
func TestOutboxtestRunsTheForwardersHandlerUntilIdle(t *testing.T) {
	ctx := context.Background()
	e := fwdtest.NewEnv(t)
	e.Register("orders", 4)
	kc := kafkatest.New(t)
	kt := kc.Topic(t, "orders", 4, nil)

	pub := fwdtest.NewPublisher(t, e)
	for i := 0; i < 6; i++ {
		pub.Round("orders", 25, nil)
	}
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber:  outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced(), RejectHandler: e.DeadLetters()},
		Topics:      []string{"orders"},
		Target:      newKafkaTarget(t, kc, false),
		TargetTopic: func(string) string { return kt },
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fwd.Close() })
	if _, _, err := fwd.Consumer(ctx, "payments"); err == nil {
		t.Fatal("Consumer of a topic the Forwarder does not forward: no error")
	}
	cfg, handler, err := fwd.Consumer(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	r, err := apptest.NewBatchRunner(ctx, cfg, "orders", handler)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunUntilIdle(ctx)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.Acked != pub.Count() || res.Failed != 0 || res.Rejected != 0 || res.Last != apptest.Idle {
		t.Fatalf("RunUntilIdle: %+v, want %d acked and idle", res, pub.Count())
	}
	if s := fwd.Stats(); s.Messages != int64(pub.Count()) {
		t.Fatalf("forwarder stats %+v, want %d messages", s, pub.Count())
	}

	// Reading the broker (read committed) finds every message once, in key
	// order: they were committed to Kafka before RunUntilIdle returned.
	got := &fwdtest.Received{}
	kc.Consume(t, kt, got)
	outboxtest.WaitFor(t, "every message read from Kafka", 30*time.Second, func() bool { return got.Distinct() == pub.Count() })
	if dups := got.Check(t, pub.Snapshot(), nil); dups != 0 {
		t.Fatalf("%d duplicates at the broker", dups)
	}
}
