package outbox_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// consumeNackingPoison subscribes group g to orders with cfg and acks every
// message but the one with payload "poison", which it nacks; it returns how
// many times that one was delivered so far.
func consumeNackingPoison(t *testing.T, cfg outbox.SubscriberConfig) (poisonDeliveries func() int64) {
	t.Helper()
	sub, err := outbox.NewSubscriber(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	go func() {
		for m := range msgs {
			if string(m.Payload) == "poison" {
				n.Add(1)
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	return n.Load
}

// Safe by default: with no RejectHandler and no MaxAttempts, a message that
// keeps failing is dead-lettered into the schema's own table after
// DefaultMaxAttempts deliveries, and its partition goes on.
func TestAMessageThatKeepsFailingIsDeadLetteredWithoutWiring(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	publishPayloads(t, e, "orders", "ok", "poison", "ok")
	deliveries := consumeNackingPoison(t, outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "g",
		Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced()})
	outboxtest.WaitFor(t, "the cursor past every message", time.Minute, func() bool { return e.cursor(t, "g", "orders").seq == 3 })
	if got := deliveries(); got != outbox.DefaultMaxAttempts {
		t.Fatalf("the poison message was delivered %d times, want DefaultMaxAttempts (%d)", got, outbox.DefaultMaxAttempts)
	}
	var uuid, status, reason string
	var attempts int32
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT uuid, status, reason, attempts FROM "+e.Schema+".dead_letters WHERE group_name = 'g'").Scan(&uuid, &status, &reason, &attempts); err != nil {
		t.Fatalf("the schema's dead-letter table: %v", err)
	}
	if uuid != "m2" || status != "pending" || attempts != outbox.DefaultMaxAttempts || !strings.Contains(reason, "MaxAttempts") {
		t.Fatalf("dead letter %s %s attempts %d reason %q; want m2, pending, %d attempts, a MaxAttempts reason", uuid, status, attempts, reason, outbox.DefaultMaxAttempts)
	}
}

// RetryForever is the explicit choice to keep a failing message in its
// stream: it is retried past DefaultMaxAttempts and never dead-lettered.
func TestRetryForeverKeepsTheMessageInItsStream(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	publishPayloads(t, e, "orders", "ok", "poison", "ok")
	deliveries := consumeNackingPoison(t, outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "g",
		Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced(), MaxAttempts: outbox.RetryForever})
	outboxtest.WaitFor(t, "more deliveries than DefaultMaxAttempts", time.Minute, func() bool { return deliveries() > outbox.DefaultMaxAttempts+3 })
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".dead_letters"); n != 0 {
		t.Fatalf("%d dead letters with RetryForever, want none", n)
	}
	if seq := e.cursor(t, "g", "orders").seq; seq != 1 {
		t.Fatalf("cursor at %d, want 1: the partition waits behind the failing message", seq)
	}
}
