package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	publicoutboxtest "github.com/millrace/watermill-outbox/outboxtest"
)

// What a delivery holds while its handler runs: under Leased nothing of
// the database — no transaction in the message's context, no connection
// of the pool (the pool, the Subscriber's alone, drains to zero acquired
// connections while the handler waits, which a delivery holding one would
// keep from happening) — and under Transactional its transaction, on a
// connection held the whole time.
func TestALeasedHandlerHoldsNoTransactionOrConnection(t *testing.T) {
	for _, strategy := range []outbox.Strategy{outbox.Leased, outbox.Transactional} {
		t.Run(strategy.String(), func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			cfg := e.Pool.Config().Copy()
			pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			sub := e.WithPool(pool).Subscriber("billing", func(c *outbox.SubscriberConfig) {
				c.Strategy, c.DisableSequencer = strategy, true
			})
			e.Publish("orders", outboxtest.Keyed("o-1", "c-1", 1, "x"))
			e.SequenceAll()
			msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
			if err != nil {
				t.Fatal(err)
			}
			msg := <-msgs
			_, hasTx := outbox.TxFromContext[pgx.Tx](msg.Context())
			if strategy == outbox.Leased {
				if hasTx {
					t.Fatal("a Leased delivery carries a transaction")
				}
				outboxtest.WaitFor(t, "no connection of the pool acquired while the Leased handler runs", 30*time.Second, func() bool {
					return pool.Stat().AcquiredConns() == 0
				})
			} else {
				if !hasTx {
					t.Fatal("a Transactional delivery carries no transaction")
				}
				tx, _ := outbox.TxFromContext[pgx.Tx](msg.Context())
				if err := tx.QueryRow(context.Background(), "SELECT 1").Scan(new(int)); err != nil {
					t.Fatalf("the delivery's transaction: %v", err)
				}
				if n := pool.Stat().AcquiredConns(); n < 1 {
					t.Fatalf("%d connections acquired while the Transactional handler runs, want its transaction's", n)
				}
			}
			msg.Ack()
		})
	}
}

// A partition with nothing to deliver is polled without counting a
// delivery: its cursor's deliveries stay 0 however often it is polled (each
// Tick of the Subscriber's own workers is a poll of every partition), and
// count 1 while a message is handed out.
func TestAnIdlePartitionsPollsCountNoDelivery(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 2)
	ctx := outboxtest.Ctx(t)
	deliveries := func() int64 {
		return e.Int("SELECT coalesce(sum(deliveries), 0) FROM " + e.Schema + ".cursors WHERE group_name = 'billing'")
	}
	var whileHandled int64 = -1
	r, err := publicoutboxtest.NewRunner(ctx, outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "billing"}, "orders",
		func(*message.Message) error { whileHandled = deliveries(); return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 5 {
		res, err := r.Tick(ctx)
		if err != nil || res.State != publicoutboxtest.Idle || res.Partitions != 2 {
			t.Fatalf("tick %d on an empty topic: %+v, %v", i, res, err)
		}
	}
	if n := deliveries(); n != 0 {
		t.Fatalf("%d deliveries counted after 5 polls of 2 idle partitions, want 0", n)
	}
	e.Publish("orders", outboxtest.Keyed("o-1", "c-1", 1, "x"))
	if res, err := r.RunUntilIdle(ctx); err != nil || res.Acked != 1 {
		t.Fatalf("RunUntilIdle: %+v, %v", res, err)
	}
	if whileHandled != 1 {
		t.Fatalf("%d deliveries counted while the one message was handled, want 1 (the count this test watches must move)", whileHandled)
	}
}

// Each subscription of a Subscriber is a member of its own: two topics
// joined by one Subscriber hold their leases under different owner ids, so
// that releasing one never touches the other's.
func TestEachSubscriptionLeasesUnderAnOwnerIDOfItsOwn(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	e.Register("refunds", 1)
	sub := e.Subscriber("billing", nil)
	for _, topic := range []string{"orders", "refunds"} {
		if _, err := sub.Subscribe(outboxtest.Ctx(t), topic); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.WaitFor(t, "both topics leased", 30*time.Second, func() bool {
		return e.Int("SELECT count(*) FROM "+e.Schema+".cursors WHERE group_name = 'billing' AND lease_owner IS NOT NULL") == 2
	})
	if n := e.Int("SELECT count(DISTINCT lease_owner) FROM " + e.Schema + ".cursors WHERE group_name = 'billing'"); n != 2 {
		t.Fatalf("%d distinct lease owners for the two subscriptions, want 2", n)
	}
}

// A delivered message says when it was published and when it was
// sequenced (the seeds' timestamps): both in RFC 3339, in that order,
// within the test's span, the same on a redelivery.
func TestADeliveredMessageCarriesItsPublishAndSequenceTimes(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	ctx := outboxtest.Ctx(t)
	before := time.Now()
	e.Publish("orders", outboxtest.Keyed("o-1", "c-1", 1, "x"))
	type stamps struct{ published, sequenced time.Time }
	var seen []stamps
	r, err := publicoutboxtest.NewRunner(ctx, outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "billing", Tuning: outboxtest.FastTuning()}, "orders",
		func(m *message.Message) error {
			p, perr := time.Parse(time.RFC3339Nano, m.Metadata.Get(outbox.MetadataPublishedAt))
			s, serr := time.Parse(time.RFC3339Nano, m.Metadata.Get(outbox.MetadataSequencedAt))
			if perr != nil || serr != nil {
				t.Errorf("metadata %v: %v, %v", m.Metadata, perr, serr)
			}
			seen = append(seen, stamps{p, s})
			if len(seen) == 1 {
				return errors.New("once more") // a redelivery carries the same times
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for len(seen) < 2 {
		res, err := r.Tick(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.State == publicoutboxtest.BackingOff {
			time.Sleep(res.RetryIn) // FastTuning's backoff: milliseconds
		}
	}
	after := time.Now()
	s := seen[0]
	if s.published.Before(before.Add(-time.Second)) || s.sequenced.Before(s.published) || s.sequenced.After(after.Add(time.Second)) {
		t.Fatalf("published %v, sequenced %v; want before ≤ published ≤ sequenced ≤ after (%v, %v)", s.published, s.sequenced, before, after)
	}
	if seen[1] != s {
		t.Fatalf("the redelivery carries %+v, the first delivery %+v", seen[1], s)
	}
}
