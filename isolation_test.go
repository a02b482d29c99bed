package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/retention"
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
		c.MaxAttempts = outbox.RetryForever // a poisoned key stays held until the test fixes it
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
	if errors.Is(err, outbox.ErrNotFound) {
		return admin.PartitionStatus{Partition: -1} // the group has not joined yet
	}
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
	return admin.PartitionStatus{Partition: -1} // the group has not joined yet
}

func TestFailingKeyWaitsAloneAndKeepsItsOrder(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
				rejected []outboxtype.RejectedMessage
			)
			isoConsumer(t, e, w, "g", "orders", func(_, uuid string) bool { return uuid == "A1" }, func(c *outbox.SubscriberConfig) {
				c.MaxAttempts = 3
				c.RejectHandler = outboxtype.RejectHandlerFunc(func(_ context.Context, _ pgx.Tx, m outboxtype.RejectedMessage) error {
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

// Past the bounds the partition blocks as without isolation, and says so;
// it isolates again once the held keys drain.
func TestIsolationBoundsFallBackToBlockingAndSaySo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.createEffects(t)
	// A and D fail; the bound holds one key. B's messages after D's first
	// wait behind D (blocking), those before it flow.
	e.Publish("orders",
		outboxtest.Keyed("A1", "A", 1, "A"), outboxtest.Keyed("B1", "B", 1, "B"),
		outboxtest.Keyed("D1", "D", 1, "D"), outboxtest.Keyed("B2", "B", 2, "B"),
		outboxtest.Keyed("A2", "A", 2, "A"), outboxtest.Keyed("B3", "B", 3, "B"))
	var fixed atomic.Bool
	isoConsumer(t, e, isoWays[0], "g", "orders", func(key, _ string) bool { return (key == "A" || key == "D") && !fixed.Load() },
		func(c *outbox.SubscriberConfig) { c.KeyIsolation.MaxHeldKeys = 1 })
	var st admin.PartitionStatus
	outboxtest.WaitFor(t, "the partition blocking on D, reported", 10*time.Second, func() bool {
		st = heldStatus(t, e, "g", "orders")
		return st.IsolationFullSince != nil && st.Attempts >= 2
	})
	if len(st.HeldKeys) != 1 || st.HeldKeys[0].Key != "A" || st.ScanSeq != 2 || st.LastError == "" {
		t.Fatalf("status %+v: want A held, the scan blocked before D1 (seq 3) with its failures on the cursor row", st)
	}
	if got := e.effectsOf(t, "B"); fmt.Sprint(got) != "[1]" {
		t.Fatalf("B's effects %v: want only B1 (B2 is behind the blocking D1)", got)
	}
	assertMetric(t, e, "outbox_partitions_isolation_full", 1)
	assertMetric(t, e, "outbox_held_keys", 1)
	assertMetric(t, e, "outbox_held_messages", 1) // A1 (A2 comes after the blocking D1)
	fixed.Store(true)
	outboxtest.WaitFor(t, "everything done", 20*time.Second, func() bool { return e.Rows("effects") == 6 })
	inOrderOnce(t, "A", e.effectsOf(t, "A"), 2)
	inOrderOnce(t, "B", e.effectsOf(t, "B"), 3)
	outboxtest.WaitFor(t, "the fallback cleared", 10*time.Second, func() bool {
		return heldStatus(t, e, "g", "orders").IsolationFullSince == nil
	})
	for _, m := range []string{"outbox_partitions_isolation_full", "outbox_held_keys", "outbox_held_messages"} {
		assertMetric(t, e, m, 0)
	}
}

// Impossible bounds are a typed error naming the field, before anything
// runs.
func TestKeyIsolationBoundsAreValidated(t *testing.T) {
	t.Parallel()
	for name, k := range map[string]outbox.KeyIsolation{
		"KeyIsolation.MaxHeldKeys": {Enabled: true, MaxHeldKeys: -1},
	} {
		err := outbox.SubscriberConfig{Pool: &pgxpool.Pool{}, ConsumerGroup: "g", KeyIsolation: k}.Validate()
		var ce *outboxtype.ConfigError
		if !errors.As(err, &ce) || ce.Field != name || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want a ConfigError on %s", k, err, name)
		}
	}
	if err := (outbox.KeyIsolation{Enabled: true}).Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

// Keyless messages carry no order: a failing one is held alone, and the
// keyless messages after it flow.
func TestKeylessMessagesAreNeverHeldBehindEachOther(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.createEffects(t)
	var msgs []*message.Message
	for i := 1; i <= 5; i++ {
		m := message.NewMessage(fmt.Sprintf("x%d", i), []byte("x"))
		m.Metadata.Set("n", strconv.Itoa(i))
		msgs = append(msgs, m)
	}
	e.Publish("orders", msgs...)
	var fixed atomic.Bool
	isoConsumer(t, e, isoWays[0], "g", "orders", func(_, uuid string) bool { return uuid == "x2" && !fixed.Load() }, nil)
	outboxtest.WaitFor(t, "x1, x3, x4, x5 done while x2 fails", 10*time.Second, func() bool { return e.Rows("effects") == 4 })
	st := heldStatus(t, e, "g", "orders")
	if len(st.HeldKeys) != 1 || !st.HeldKeys[0].Keyless || st.HeldKeys[0].HeadSeq != 2 || st.HeldKeys[0].Messages != 1 {
		t.Fatalf("held %+v: want x2 alone", st.HeldKeys)
	}
	fixed.Store(true)
	outboxtest.WaitFor(t, "x2 done", 10*time.Second, func() bool { return e.Rows("effects") == 5 })
}

// An operator retries a held key at once, or dead-letters it: its held
// messages go to the RejectHandler in order and its newer ones flow.
func TestOperatorRetriesOrDeadLettersAHeldKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.createEffects(t)
	publishInterleaved(e, "orders", 3, "A", "B")
	var (
		mu       sync.Mutex
		rejected []string
		fixed    atomic.Bool
	)
	isoConsumer(t, e, isoWays[0], "g", "orders", func(key, _ string) bool { return key == "A" && !fixed.Load() }, func(c *outbox.SubscriberConfig) {
		c.Tuning.BackoffBase, c.Tuning.BackoffMax = time.Hour, time.Hour // only the operator retries
		c.RejectHandler = outboxtype.RejectHandlerFunc(func(_ context.Context, _ pgx.Tx, m outboxtype.RejectedMessage) error {
			mu.Lock()
			defer mu.Unlock()
			rejected = append(rejected, m.UUID+": "+m.Reason.Error())
			return nil
		})
	})
	outboxtest.WaitFor(t, "B done, all 3 of A held", 10*time.Second, func() bool {
		// (The worker holds A's later messages as it reaches them: the
		// key is held from its first, and holds 3 once B is past.)
		held := heldStatus(t, e, "g", "orders").HeldKeys
		return len(e.effectsOf(t, "B")) == 3 && len(held) == 1 && held[0].Messages == 3
	})
	a, err := admin.New(admin.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	if _, err := a.RetryHeldNow(ctx, admin.HeldRef{Group: "g", Topic: "orders", Key: "Z"}); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("retry of a key not held: %v, want ErrNotFound", err)
	}
	if _, err := a.RetryHeldNow(ctx, admin.HeldRef{Group: "g", Topic: "orders"}); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("retry without a key: %v, want ErrInvalidArgument", err)
	}
	// Retry now: still failing, one attempt more, well before the hour.
	before := heldStatus(t, e, "g", "orders").HeldKeys[0].Attempts
	if n, err := a.RetryHeldNow(ctx, admin.HeldRef{Group: "g", Topic: "orders", Key: "A"}); err != nil || n != 3 {
		t.Fatalf("RetryHeldNow: %d, %v; want the 3 messages of A", n, err)
	}
	outboxtest.WaitFor(t, "the retry at once", 10*time.Second, func() bool {
		k := heldStatus(t, e, "g", "orders").HeldKeys[0]
		return k.Attempts == 1 && k.RetryAt != nil && time.Until(*k.RetryAt) > 30*time.Minute
	})
	t.Logf("attempts before the operator's retry: %d", before)
	// Dead-letter: A1..A3 go out in order; a newer A flows.
	if n, err := a.DeadLetterHeld(ctx, admin.HeldRef{Group: "g", Topic: "orders", Key: "A"}); err != nil || n != 3 {
		t.Fatalf("DeadLetterHeld: %d, %v", n, err)
	}
	outboxtest.WaitFor(t, "A dead-lettered", 10*time.Second, func() bool { return e.Rows("held") == 0 })
	mu.Lock()
	got := append([]string(nil), rejected...)
	mu.Unlock()
	if len(got) != 3 || !strings.HasPrefix(got[0], "A1: ") || !strings.HasPrefix(got[2], "A3: ") || !strings.Contains(got[0], "admin.DeadLetterHeld") {
		t.Fatalf("rejected %q: want A1, A2, A3 dead-lettered by the operator", got)
	}
	fixed.Store(true)
	e.Publish("orders", outboxtest.Keyed("A4", "A", 4, "A"))
	outboxtest.WaitFor(t, "the newer A", 10*time.Second, func() bool { return fmt.Sprint(e.effectsOf(t, "A")) == "[4]" })
}

// Retention keeps held messages: the finished seq, not the scan position,
// is what a group holds the log at.
func TestRetentionKeepsHeldMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.createEffects(t)
	publishInterleaved(e, "orders", 5, "A", "B")
	isoConsumer(t, e, isoWays[0], "g", "orders", func(key, _ string) bool { return key == "A" }, nil)
	outboxtest.WaitFor(t, "B done, A held", 10*time.Second, func() bool {
		return len(e.effectsOf(t, "B")) == 5 && e.Rows("held") == 5
	})
	v, err := retention.NewVacuum(retention.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.VacuumOnce(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got := e.Int("SELECT count(*) FROM " + e.Schema + ".log WHERE partition_key = 'A'"); got != 5 {
		t.Fatalf("%d of A's 5 held messages left in the log after a vacuum", got)
	}
	if got := e.Int("SELECT min(seq) FROM " + e.Schema + ".log"); got != 1 {
		t.Fatalf("the vacuum trimmed up to %d: A1 (seq 1) is held", got-1)
	}
}

// assertMetric reads a gauge of group g, topic orders from a metrics
// collector on the test's schema.
func assertMetric(t *testing.T, e env, name string, want float64) {
	t.Helper()
	c, err := metrics.NewCollector(metrics.CollectorConfig{Pool: e.Pool, Schema: e.Schema, CollectInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["group"] == "g" && labels["topic"] == "orders" {
				if got := m.GetGauge().GetValue(); got != want {
					t.Fatalf("%s = %v, want %v", name, got, want)
				}
				return
			}
		}
	}
	t.Fatalf("no %s for group g, topic orders", name)
}

// A dead-letter request of a held key is carried out by the Subscriber's
// RejectHandler, unless set the schema's own dead-letter table: the key's
// held messages are dead-lettered, its retries stop, the other key went on.
func TestDeadLetterRequestOfAHeldKeyGoesToTheSchemasTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.createEffects(t)
	publishInterleaved(e, "orders", 2, "A", "B")
	isoConsumer(t, e, isoWays[0], "g", "orders", func(key, _ string) bool { return key == "A" }, nil)
	outboxtest.WaitFor(t, "A held", 10*time.Second, func() bool { return e.Rows("held") == 2 })
	a, err := admin.New(admin.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.DeadLetterHeld(outboxtest.Ctx(t), admin.HeldRef{Group: "g", Topic: "orders", Key: "A"}); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "A's messages in the schema's dead-letter table", 20*time.Second, func() bool {
		return e.Int("SELECT count(*) FROM "+e.Schema+".dead_letters WHERE partition_key = 'A'") == 2 && e.Rows("held") == 0
	})
	if got := e.effectsOf(t, "A"); len(got) != 0 {
		t.Fatalf("A took effect %d times after its dead-letter request", len(got))
	}
	inOrderOnce(t, "B", e.effectsOf(t, "B"), 2)
}

// The Transactional strategy holds its bulkhead slot for the whole turn:
// parking a batch must not ask for a second one (with a bulkhead of one
// slot, that waited for ever).
func TestTransactionalParkingNeedsNoSecondBulkheadSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.createEffects(t)
	var fixed atomic.Bool
	isoConsumer(t, e, isoWays[1], "g", "orders", func(key, _ string) bool { return key == "A" && !fixed.Load() },
		func(c *outbox.SubscriberConfig) { c.Advanced.MaxConcurrentPartitions = 1 })
	e.Publish("orders", outboxtest.Keyed("A1", "A", 1, "A"))
	outboxtest.WaitFor(t, "A held", 10*time.Second, func() bool { return e.Rows("held") == 1 })
	// A batch of A's messages only: all parked, no handler runs.
	e.Publish("orders", outboxtest.Keyed("A2", "A", 2, "A"), outboxtest.Keyed("A3", "A", 3, "A"))
	outboxtest.WaitFor(t, "A2 and A3 parked", 10*time.Second, func() bool { return e.Rows("held") == 3 })
	e.Publish("orders", outboxtest.Keyed("B1", "B", 1, "B"))
	outboxtest.WaitFor(t, "B1 delivered", 10*time.Second, func() bool { return len(e.effectsOf(t, "B")) == 1 })
	fixed.Store(true)
	outboxtest.WaitFor(t, "A done", 20*time.Second, func() bool { return len(e.effectsOf(t, "A")) == 3 })
	inOrderOnce(t, "A", e.effectsOf(t, "A"), 3)
}

// A held key that cannot be served (here its head's log row was deleted
// by hand) waits and is logged; it does not stop the rest of its partition.
func TestABrokenHeldKeyDoesNotStopItsPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.createEffects(t)
	publishInterleaved(e, "orders", 1, "A", "B")
	isoConsumer(t, e, isoWays[0], "g", "orders", func(key, _ string) bool { return key == "A" }, func(c *outbox.SubscriberConfig) {
		c.Tuning.BackoffBase, c.Tuning.BackoffMax = 10*time.Millisecond, 10*time.Millisecond
	})
	outboxtest.WaitFor(t, "A held", 10*time.Second, func() bool { return e.Rows("held") == 1 })
	e.Exec("DELETE FROM " + e.Schema + ".log WHERE partition_key = 'A'")
	time.Sleep(100 * time.Millisecond) // a few retries of A, each failing to read it
	e.Publish("orders", outboxtest.Keyed("B2", "B", 2, "B"), outboxtest.Keyed("C1", "C", 1, "C"))
	outboxtest.WaitFor(t, "B2 and C1 delivered past the broken key", 10*time.Second, func() bool {
		return len(e.effectsOf(t, "B")) == 2 && len(e.effectsOf(t, "C")) == 1
	})
	if st := heldStatus(t, e, "g", "orders"); len(st.HeldKeys) != 1 || st.HeldKeys[0].Key != "A" {
		t.Fatalf("held %+v: want A still shown", st.HeldKeys)
	}
}
