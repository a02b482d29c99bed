package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
)

// fakeClock is a sequencer clock a test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// delayed is a keyed message due at t.
func delayed(t *testing.T, uuid, key string, at time.Time) *message.Message {
	t.Helper()
	m := outboxtest.Keyed(uuid, key, 0, "x")
	if err := outbox.DeliverAt(m, at); err != nil {
		t.Fatal(err)
	}
	return m
}

// sequencedUUIDs lists the uuids of topic's log, in seq order per
// partition, partitions in order.
func sequencedUUIDs(t *testing.T, e env, topic string) []string {
	var out []string
	for _, r := range e.readLog(t, topic) {
		out = append(out, r.UUID)
	}
	return out
}

// A delayed message is not sequenced before its time; the later messages
// of its key wait behind it; other keys, keyless messages and unordered
// ones pass. When the time comes, the delayed message and then those
// behind it are sequenced, in their order.
func TestDelayedMessageWaitsAndHoldsItsKeyBack(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	clock := newFakeClock()
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, Clock: clock.Now}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	due := time.Now().Add(time.Hour)
	unordered := outboxtest.Keyed("a3-unordered", "a", 3, "x")
	if err := outbox.Unordered(unordered); err != nil {
		t.Fatal(err)
	}
	keyless := message.NewMessage("keyless", []byte("x"))
	e.Publish("orders",
		outboxtest.Keyed("a1", "a", 1, "x"),
		delayed(t, "a2-delayed", "a", due),
		outboxtest.Keyed("a4", "a", 4, "x"), // waits behind a2
		outboxtest.Keyed("b1", "b", 1, "x"),
		unordered, // passes a2
		keyless,
	)
	if _, err := seq.SequenceAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := sequencedUUIDs(t, e, "orders"), []string{"a1", "b1", "a3-unordered", "keyless"}; !slices.Equal(got, want) {
		t.Fatalf("sequenced before the time: %v, want %v", got, want)
	}
	clock.Advance(59 * time.Minute)
	if _, err := seq.SequenceAll(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(sequencedUUIDs(t, e, "orders")); n != 4 {
		t.Fatalf("%d sequenced a minute before the time, want 4", n)
	}
	clock.Advance(2 * time.Minute)
	if _, err := seq.SequenceAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := sequencedUUIDs(t, e, "orders"), []string{"a1", "b1", "a3-unordered", "keyless", "a2-delayed", "a4"}; !slices.Equal(got, want) {
		t.Fatalf("sequenced once due: %v, want %v", got, want)
	}
	for _, r := range e.readLog(t, "orders") {
		if r.UUID == "a2-delayed" {
			if at, ok := outbox.DeliveryTime(&message.Message{Metadata: r.Metadata}); !ok || !at.Equal(due.UTC().Truncate(time.Microsecond)) && at.Sub(due).Abs() > time.Microsecond {
				t.Errorf("the delivered message's %s: %v (%v), want %v", outbox.MetadataDeliverAt, at, ok, due)
			}
		}
	}
}

// A running sequencer wakes when a delayed message is due, not at its next
// poll (an hour here), and not before.
func TestSequencerWakesWhenADelayedMessageIsDue(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 2)
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- seq.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = seq.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	due := time.Now().Add(700 * time.Millisecond)
	e.Publish("orders", delayed(t, "d1", "k", due), outboxtest.Keyed("after", "k", 2, "x"))
	time.Sleep(200 * time.Millisecond)
	if n := e.Rows("log"); n != 0 && time.Now().Before(due) {
		t.Fatalf("%d sequenced before the time", n)
	}
	took := outboxtest.WaitFor(t, "both sequenced once due", 10*time.Second, func() bool { return e.Rows("log") == 2 })
	if late := time.Since(due); late > 2*time.Second {
		t.Fatalf("sequenced %v after the time (waited %v): it did not wake at the time", late, took)
	}
	var at time.Time
	if err := e.Pool.QueryRow(context.Background(), "SELECT min(sequenced_at) FROM "+e.Schema+".log").Scan(&at); err != nil {
		t.Fatal(err)
	}
	if at.Before(due) {
		t.Fatalf("sequenced at %v, before its time %v", at, due)
	}
}

// Thousands of delayed messages, mixed with undelayed ones of the same
// keys, through sequencers stopped and started again: every message is
// sequenced, none before its time, and each key in its publish order.
func TestThousandsOfDelayedMessagesAcrossARestart(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 8)
	const keys, perKey = 40, 60 // 2,400 messages, about a third delayed
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	want := map[string][]string{}
	dueOf := map[string]time.Time{}
	pub := e.Publisher(nil)
	for i := range perKey {
		var batch []*message.Message
		for k := range keys {
			key := fmt.Sprintf("k%02d", k)
			uuid := fmt.Sprintf("%s-%03d", key, i)
			m := outboxtest.Keyed(uuid, key, i, "x")
			if rng.IntN(3) == 0 {
				due := start.Add(time.Duration(200+rng.IntN(2300)) * time.Millisecond)
				if err := outbox.DeliverAt(m, due); err != nil {
					t.Fatal(err)
				}
				dueOf[uuid] = due
			}
			want[key] = append(want[key], uuid)
			batch = append(batch, m)
		}
		if err := pub.Publish("orders", batch...); err != nil {
			t.Fatal(err)
		}
	}
	run := func(d time.Duration) {
		seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		if err := seq.Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run(800 * time.Millisecond) // stopped with most delayed messages waiting
	mid := e.Rows("log")
	if mid == 0 || mid == keys*perKey {
		t.Fatalf("%d of %d sequenced before the restart: the restart proves nothing", mid, keys*perKey)
	}
	run(3 * time.Second)
	if n := e.Rows("log"); n != keys*perKey {
		t.Fatalf("%d of %d sequenced", n, keys*perKey)
	}
	got := map[string][]string{}
	rows, err := e.Pool.Query(context.Background(), "SELECT partition_key, uuid, sequenced_at FROM "+e.Schema+".log ORDER BY partition, seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var key, uuid string
		var at time.Time
		if err := rows.Scan(&key, &uuid, &at); err != nil {
			t.Fatal(err)
		}
		if due, ok := dueOf[uuid]; ok && at.Before(due) {
			t.Errorf("%s sequenced at %v, %v before its time", uuid, at, due.Sub(at))
		}
		got[key] = append(got[key], uuid)
	}
	for key, w := range want {
		if !slices.Equal(got[key], w) {
			t.Fatalf("key %s out of its order:\n got %v\nwant %v", key, got[key], w)
		}
	}
}

// Bad input is a typed error, and nothing is set on the message.
func TestDeliverAtRefusesBadInput(t *testing.T) {
	m := message.NewMessage("u", nil)
	for name, err := range map[string]error{
		"a past time":    outbox.DeliverAt(m, time.Now().Add(-time.Minute)),
		"a zero time":    outbox.DeliverAt(m, time.Time{}),
		"a nil message":  outbox.DeliverAt(nil, time.Now().Add(time.Minute)),
		"a zero delay":   outbox.DeliverAfter(m, 0),
		"a nil message ": outbox.DeliverAfter(nil, time.Minute),
		"Unordered(nil)": outbox.Unordered(nil),
	} {
		if !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if m.Metadata.Get(outbox.MetadataDeliverAt) != "" {
		t.Fatal("a refused DeliverAt set the metadata")
	}
	// A time set by hand that is not one: refused by Publish, nothing written.
	e := newEnv(t)
	e.Register("orders", 1)
	bad := outboxtest.Keyed("bad", "k", 1, "x")
	bad.Metadata.Set(outbox.MetadataDeliverAt, "tomorrow")
	var me *outbox.MessageError
	if err := e.Publisher(nil).Publish("orders", outboxtest.Keyed("good", "k", 0, "x"), bad); !errors.As(err, &me) {
		t.Fatalf("Publish of a message with a DeliverAt that is not a time: %v, want a *MessageError", err)
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows written by a refused Publish", n)
	}
}

// Status and metrics show a delayed message as delayed, with its time, and
// neither as lag nor as a message late for the sequencer.
func TestDelayedMessagesAreVisibleAndNotLate(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	ctx := outboxtest.Ctx(t)
	due := time.Now().Add(time.Hour).Truncate(time.Second)
	// A group that finished everything sequenced so far.
	e.Exec("INSERT INTO " + e.Schema + ".cursors (group_name, topic, partition, seq) VALUES ('g', 'orders', 0, 0)")
	e.Publish("orders", delayed(t, "d", "k", due), outboxtest.Keyed("behind", "k", 2, "x"))
	e.Exec("UPDATE " + e.Schema + ".pending SET created_at = now() - interval '10 minutes'")
	adm, err := admin.New(admin.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := adm.Status(ctx, admin.Filter{Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	top := rep.Topics[0]
	if top.Unsequenced != 2 || top.Delayed != 1 || top.NextDueAt == nil || !top.NextDueAt.Equal(due) {
		t.Fatalf("status: %d pending, %d delayed, next due %v; want 2, 1, %v", top.Unsequenced, top.Delayed, top.NextDueAt, due)
	}
	if g := top.Groups[0]; g.Lag != 0 || g.MaxLagSeconds != 0 {
		t.Fatalf("group g: lag %d (%.0f s) for messages waiting for their time, want 0", g.Lag, g.MaxLagSeconds)
	}
	reg := prometheus.NewRegistry()
	c, err := metrics.NewCollector(metrics.CollectorConfig{Pool: e.Pool, Schema: e.Schema})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()] += m.GetGauge().GetValue()
		}
	}
	if got["outbox_delayed_messages"] != 1 || got["outbox_pending_messages"] != 2 || got["outbox_pending_oldest_age_seconds"] != 0 || got["outbox_lag_messages"] != 0 {
		t.Fatalf("metrics: %v; want 1 delayed of 2 pending, no age, no lag", got)
	}
}

// A delayed message with a dedup key is delayed too (its publish goes
// through the dedup statement).
func TestDelayedMessageWithADedupKey(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	clock := newFakeClock()
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, Clock: clock.Now}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := delayed(t, "d", "k", time.Now().Add(time.Hour))
	if err := outbox.DedupKey(m, "reminder-42"); err != nil {
		t.Fatal(err)
	}
	e.Publish("orders", m, outboxtest.Keyed("behind", "k", 2, "x"))
	if _, err := seq.SequenceAll(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n := e.Rows("log"); n != 0 {
		t.Fatalf("%d sequenced before the time", n)
	}
	clock.Advance(2 * time.Hour)
	if _, err := seq.SequenceAll(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got := sequencedUUIDs(t, e, "orders"); !slices.Equal(got, []string{"d", "behind"}) {
		t.Fatalf("sequenced %v once due, want [d behind]", got)
	}
}
