package outbox_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

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
	t.Parallel()
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
	t.Parallel()
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

// Failure mode 5: a handler named where the message is rejected
// (RejectTo) takes it, not the Subscriber's default (the schema's
// dead-letter table); the member row says the group can reject.
func TestRejectToNeedsNoSubscriberRejectHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	publishPayloads(t, e, "orders", "ok", "poison", "ok")
	rejects, rejected := rejectLog(t, e)
	logs := &warnCapture{}
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "g", Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced()}, logs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if string(m.Payload) == "poison" {
				_ = outbox.RejectTo(m, errors.New("bad payload"), rejects)
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "the cursor past every message", 30*time.Second, func() bool { return e.cursor(t, "g", "orders").seq == 3 })
	if got := rejected(); len(got) != 1 || got[0].UUID != "m2" || got[0].Reason.Error() != "bad payload" {
		t.Fatalf("rejected %+v, want m2 with its reason", got)
	}
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".dead_letters"); n != 0 {
		t.Fatalf("%d entries in the default dead-letter table, want none: RejectTo named the handler", n)
	}
	if w := logs.warnings(); len(w) != 0 {
		t.Fatalf("warnings logged: %v", w)
	}
	var canReject bool
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT bool_and(can_reject) FROM "+e.Schema+".members WHERE group_name = 'g'").Scan(&canReject); err != nil || !canReject {
		t.Fatalf("members.can_reject = %v (%v), want true", canReject, err)
	}
	if err := outbox.Reject(nil, errors.New("x")); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("Reject(nil) = %v, want ErrInvalidMessage", err)
	}
}

// warnCapture records warnings (it implements outboxtype.WarnLogger).
type warnCapture struct {
	watermill.NopLogger
	mu   sync.Mutex
	msgs []string
}

func (w *warnCapture) Warn(msg string, _ watermill.LogFields) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warnCapture) With(watermill.LogFields) watermill.LoggerAdapter { return w }

func (w *warnCapture) warnings() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}
