package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
)

// Every dead-lettering counts as outcome="reject", whatever the path: a
// Transactional handler that times out until MaxAttempts, a message that
// crashed its consumer alone MaxAttempts times, a message whose payload is
// missing. The OutboxDeadLettersGrowing alert reads that outcome.
func TestEveryDeadLetteringCountsAsAReject(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reject := func(group string) float64 {
		return value(t, reg, "outbox_deliveries_total", "group", group, "outcome", "reject")
	}
	deadLetters := func(group string) int64 {
		return b.Int("SELECT count(*) FROM "+b.Schema+".dead_letters WHERE group_name = $1", group)
	}

	t.Run("transactional timeouts", func(t *testing.T) {
		b.Register("slow", 1)
		b.Publish("slow", message.NewMessage("hangs", []byte("x")))
		b.SequenceAll()
		sub := b.Subscriber("tx", func(c *outbox.SubscriberConfig) {
			c.Strategy, c.RejectHandler, c.MaxAttempts = outbox.Transactional, store, 2
			c.DisableSequencer, c.HandlerTimeout = true, 200*time.Millisecond
		})
		msgs, err := sub.Subscribe(ctx, "slow")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for range msgs { // never answers
			}
		}()
		outboxtest.WaitFor(t, "the dead letter", 30*time.Second, func() bool { return deadLetters("tx") == 1 })
		outboxtest.WaitFor(t, "the rejection counted", 5*time.Second, func() bool { return reject("tx") == 1 })
		if v := value(t, reg, "outbox_deliveries_total", "group", "tx", "outcome", "timeout"); v != 1 {
			t.Errorf("timeouts counted %v, want 1 (the first; the second is the rejection)", v)
		}
		if s := sub.Stats(); s.Rejected != 1 {
			t.Errorf("Stats().Rejected = %d, want 1", s.Rejected)
		}
	})

	t.Run("crash", func(t *testing.T) {
		b.Register("crashes", 1)
		b.Publish("crashes", message.NewMessage("crashed", []byte("x")))
		b.SequenceAll()
		// The state a process leaves that died twice while delivering the
		// message alone (MaxAttempts 3) and once more, alone, now.
		b.Exec("INSERT INTO " + b.Schema + `.cursors (group_name, topic, partition, seq, attempts, deliveries, inflight_from, inflight_to, inflight_solo, lease_owner, lease_expires_at)
			VALUES ('crash', 'crashes', 0, 0, 2, 3, 1, 1, true, 'dead', now() - interval '1 second')`)
		sub := b.Subscriber("crash", func(c *outbox.SubscriberConfig) {
			c.RejectHandler, c.MaxAttempts, c.DisableSequencer = store, 3, true
		})
		msgs, err := sub.Subscribe(ctx, "crashes")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range msgs {
				t.Errorf("%s delivered again after MaxAttempts", m.UUID)
				m.Ack()
			}
		}()
		outboxtest.WaitFor(t, "the dead letter", 30*time.Second, func() bool { return deadLetters("crash") == 1 })
		outboxtest.WaitFor(t, "the rejection counted", 5*time.Second, func() bool { return reject("crash") == 1 })
		if v := value(t, reg, "outbox_deliveries_total", "group", "crash", "outcome", "crash"); v != 1 {
			t.Errorf("crashes counted %v, want 1", v)
		}
	})

	t.Run("missing payload", func(t *testing.T) {
		b.Register("bodies", 1)
		b.Publish("bodies", message.NewMessage("lost", []byte(strings.Repeat("x", 4096))))
		b.SequenceAll()
		b.Exec("DELETE FROM " + b.Schema + ".bodies")
		sub := b.Subscriber("bodies", func(c *outbox.SubscriberConfig) {
			c.RejectHandler, c.MaxAttempts, c.DisableSequencer = store, 2, true
		})
		msgs, err := sub.Subscribe(ctx, "bodies")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range msgs {
				t.Errorf("%s delivered without its payload (%d bytes)", m.UUID, len(m.Payload))
				m.Ack()
			}
		}()
		outboxtest.WaitFor(t, "the dead letter", 30*time.Second, func() bool { return deadLetters("bodies") == 1 })
		outboxtest.WaitFor(t, "the rejection counted", 5*time.Second, func() bool { return reject("bodies") == 1 })
	})
}
