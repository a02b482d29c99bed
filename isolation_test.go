package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Key-level isolation (issue 15): a failing key waits alone, its partition
// keeps flowing, and the key's order is kept.

// isoWay is one way of consuming: a strategy, one message at a time or in
// batches.
type isoWay struct {
	name     string
	strategy outbox.Strategy
	batches  bool
}

var isoWays = []isoWay{
	{"leased", outbox.Leased, false},
	{"transactional", outbox.Transactional, false},
	{"leased batches", outbox.Leased, true},
	{"transactional batches", outbox.Transactional, true},
}

// isoConsumer consumes topic for group in way w: every message whose key
// poisoned reports fails (Nack, or the failing index of a batch); the
// others write an effect row (key, n, uuid) — in the handler's transaction
// for the Transactional strategy — and succeed.
func isoConsumer(t *testing.T, e env, w isoWay, group, topic string, poisoned func(key, uuid string) bool, edit func(*outbox.SubscriberConfig)) *outbox.Subscriber {
	t.Helper()
	sub := e.Subscriber(group, func(c *outbox.SubscriberConfig) {
		c.Strategy = w.strategy
		c.KeyIsolation = outbox.KeyIsolation{Enabled: true}
		if edit != nil {
			edit(c)
		}
	})
	effect := func(ctx context.Context, m *message.Message) error {
		key := m.Metadata.Get(outbox.MetadataPartitionKey)
		if poisoned(key, m.UUID) {
			return fmt.Errorf("key %s is poisoned", key)
		}
		n, _ := strconv.Atoi(m.Metadata.Get("n"))
		stmt := "INSERT INTO " + e.Schema + ".effects (key, n, uuid) VALUES ($1, $2, $3)"
		if tx, ok := pgxTxFrom(ctx); ok {
			_, err := tx.Exec(ctx, stmt, key, n, m.UUID)
			return err
		}
		_, err := e.Pool.Exec(ctx, stmt, key, n, m.UUID)
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if w.batches {
		consumed := make(chan error, 1)
		go func() {
			consumed <- sub.ConsumeBatches(ctx, topic, func(ctx context.Context, batch []*message.Message) (int, error) {
				for i, m := range batch {
					if err := effect(ctx, m); err != nil {
						return i, err
					}
				}
				return len(batch), nil
			})
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-consumed; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("ConsumeBatches: %v", err)
			}
		})
		return sub
	}
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if err := effect(m.Context(), m); err != nil {
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	return sub
}

func (e env) createEffects(t *testing.T) {
	t.Helper()
	e.Exec("CREATE TABLE " + e.Schema + ".effects (id bigserial PRIMARY KEY, key text, n int, uuid text)")
}

// effectsOf returns the n of key's effects in the order they were written.
func (e env) effectsOf(t *testing.T, key string) []int {
	t.Helper()
	rows, err := e.Pool.Query(outboxtest.Ctx(t), "SELECT n FROM "+e.Schema+".effects WHERE key = $1 ORDER BY id", key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// inOrderOnce fails unless got is 1..n (each once, in order).
func inOrderOnce(t *testing.T, what string, got []int, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%s: %d effects %v, want %d, each once", what, len(got), got, n)
	}
	for i, v := range got {
		if v != i+1 {
			t.Fatalf("%s: effects %v: %d at position %d, want 1..%d in order", what, got, v, i+1, n)
		}
	}
}

// publishInterleaved publishes n messages of each key, interleaved (A1 B1
// C1 A2 ...), in one transaction, all to one partition.
func publishInterleaved(e env, topic string, n int, keys ...string) {
	var msgs []*message.Message
	for i := 1; i <= n; i++ {
		for _, k := range keys {
			msgs = append(msgs, outboxtest.Keyed(fmt.Sprintf("%s%d", k, i), k, i, k))
		}
	}
	e.Publish(topic, msgs...)
}

func heldStatus(t *testing.T, e env, group, topic string) admin.PartitionStatus {
	t.Helper()
	a, err := admin.New(admin.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := a.Status(outboxtest.Ctx(t), admin.Filter{Group: group, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range rep.Topics {
		for _, g := range tp.Groups {
			for _, p := range g.Partitions {
				if p.Partition == 0 {
					return p
				}
			}
		}
	}
	t.Fatalf("no status for group %s topic %s partition 0", group, topic)
	return admin.PartitionStatus{}
}

func TestFailingKeyWaitsAloneAndKeepsItsOrder(t *testing.T) {
	for _, w := range isoWays {
		t.Run(w.name, func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			e.createEffects(t)
			const n = 20
			publishInterleaved(e, "orders", n, "A", "B", "C")
			var fixed atomic.Bool
			isoConsumer(t, e, w, "g", "orders", func(key, _ string) bool { return key == "A" && !fixed.Load() }, nil)

			outboxtest.WaitFor(t, "B and C done while A fails", 30*time.Second, func() bool {
				return len(e.effectsOf(t, "B")) == n && len(e.effectsOf(t, "C")) == n
			})
			inOrderOnce(t, "B", e.effectsOf(t, "B"), n)
			inOrderOnce(t, "C", e.effectsOf(t, "C"), n)
			if got := e.effectsOf(t, "A"); len(got) != 0 {
				t.Fatalf("A's effects %v while A fails", got)
			}
			// A is held, visibly; the cursor stays below it (A1 is seq 1).
			var st admin.PartitionStatus
			outboxtest.WaitFor(t, "A held with its 20 messages", 10*time.Second, func() bool {
				st = heldStatus(t, e, "g", "orders")
				return len(st.HeldKeys) == 1 && st.HeldKeys[0].Messages == n
			})
			k := st.HeldKeys[0]
			if k.Key != "A" || k.HeadSeq != 1 || k.Attempts < 1 || k.LastError == "" || st.Cursor != 0 || st.ScanSeq != 3*n || st.Lag != 3*n {
				t.Fatalf("status: held %+v, cursor %d, scan %d, lag %d; want A from seq 1 with its attempts and error, cursor 0, scan %d, lag %d",
					k, st.Cursor, st.ScanSeq, st.Lag, 3*n, 3*n)
			}
			t.Logf("A held: attempts %d, error %q", k.Attempts, k.LastError)

			fixed.Store(true)
			outboxtest.WaitFor(t, "A done after the fix", 30*time.Second, func() bool { return len(e.effectsOf(t, "A")) == n })
			inOrderOnce(t, "A", e.effectsOf(t, "A"), n)
			outboxtest.WaitFor(t, "nothing held, the cursor at the head", 10*time.Second, func() bool {
				st = heldStatus(t, e, "g", "orders")
				return len(st.HeldKeys) == 0 && st.Cursor == 3*n
			})
			if e.Rows("held") != 0 {
				t.Fatalf("%d held rows left", e.Rows("held"))
			}

			// Newer messages of A flow at once, behind nothing.
			e.Publish("orders", outboxtest.Keyed("A21", "A", n+1, "A"), outboxtest.Keyed("B21", "B", n+1, "B"))
			outboxtest.WaitFor(t, "the newer A and B", 10*time.Second, func() bool {
				return len(e.effectsOf(t, "A")) == n+1 && len(e.effectsOf(t, "B")) == n+1
			})
			inOrderOnce(t, "A", e.effectsOf(t, "A"), n+1)
		})
	}
}

func TestHeldKeyIsDeadLetteredAfterMaxAttemptsAndItsRestFollows(t *testing.T) {
	for _, w := range isoWays[:2] {
		t.Run(w.name, func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			e.createEffects(t)
			publishInterleaved(e, "orders", 5, "A", "B")
			// A1 alone is poison: it is dead-lettered after 3 attempts,
			// then A2..A5 follow in order.
			var (
				mu       sync.Mutex
				rejected []outbox.RejectedMessage
			)
			isoConsumer(t, e, w, "g", "orders", func(_, uuid string) bool { return uuid == "A1" }, func(c *outbox.SubscriberConfig) {
				c.MaxAttempts = 3
				c.RejectHandler = outbox.RejectHandlerFunc(func(_ context.Context, _ pgx.Tx, m outbox.RejectedMessage) error {
					mu.Lock()
					defer mu.Unlock()
					rejected = append(rejected, m)
					return nil
				})
			})
			outboxtest.WaitFor(t, "A2..A5 and B done", 30*time.Second, func() bool {
				return len(e.effectsOf(t, "A")) == 4 && len(e.effectsOf(t, "B")) == 5
			})
			if got := e.effectsOf(t, "A"); fmt.Sprint(got) != "[2 3 4 5]" {
				t.Fatalf("A's effects %v, want [2 3 4 5] (A1 dead-lettered)", got)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(rejected) != 1 || rejected[0].UUID != "A1" || rejected[0].Attempts != 3 || !errors.Is(rejected[0].Reason, outbox.ErrPoison) {
				t.Fatalf("rejected %+v, want A1 after 3 attempts (ErrPoison)", rejected)
			}
		})
	}
}
