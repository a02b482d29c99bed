package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// fakeClock is a sequencer clock a test moves by hand. It counts how often
// it is read, and remembers when (by the wall clock) it took each of its
// values, so that a log row's sequenced_at tells the latest time the row
// can have been held against (heldAgainst).
type fakeClock struct {
	reads atomic.Int64
	mu    sync.Mutex
	steps []clockStep // in the order taken
}

// clockStep is a value the clock took (at) and the wall time it took it.
type clockStep struct{ wall, at time.Time }

func newFakeClock() *fakeClock { return newFakeClockAt(time.Now()) }

func newFakeClockAt(at time.Time) *fakeClock {
	c := &fakeClock{}
	c.Set(at)
	return c
}

func (c *fakeClock) Now() time.Time {
	c.reads.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.steps[len(c.steps)-1].at
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	at := c.steps[len(c.steps)-1].at
	c.mu.Unlock()
	c.Set(at.Add(d))
}

// Set moves the clock to at. The wall time is taken under the lock,
// before anyone can read the new value: whoever reads it reads it later.
func (c *fakeClock) Set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steps = append(c.steps, clockStep{wall: time.Now(), at: at})
}

// heldAgainst returns the clock's value at wall time w, the sequenced_at of
// a log row: the start of the pass's transaction, which read the clock
// before it began. The pass held the row against that value or an earlier
// one. (PostgreSQL keeps microseconds: the steps' wall times are truncated
// alike, which can only make the value returned an earlier one.)
func (c *fakeClock) heldAgainst(w time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	for _, s := range c.steps {
		if !s.wall.Truncate(time.Microsecond).After(w) {
			at = s.at
		}
	}
	return at
}

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
	t.Parallel()
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
// poll (an hour here), and not before. Its clock is the test's: the
// message is due half a second after the clock's start, and the clock
// stays there until the sequencer has looked at the message, found it not
// due and gone back to sleep, however long that takes; then the clock
// moves past the time. Nothing else wakes the sequencer: were it asleep
// until its poll, the message would not be sequenced within the hour.
func TestSequencerWakesWhenADelayedMessageIsDue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 2)
	// An hour ahead of the wall clock: the due time is in the future
	// however long publishing takes.
	clock := newFakeClockAt(time.Now().Add(time.Hour))
	due := clock.Now().Add(500 * time.Millisecond)
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: time.Hour, Clock: clock.Now}, nil)
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
	e.Publish("orders", delayed(t, "d1", "k", due), outboxtest.Keyed("after", "k", 2, "x"))
	// Every turn of Run reads the clock: for a pass or a look at the
	// pending messages (two reads when a pass finds nothing: it looks for
	// the next due time too), then for how long to sleep. Five reads after
	// the publish are at least one look that began after it, found the
	// message not due and slept until its time (half a second by the
	// clock that does not move), and the look after that sleep.
	reads := clock.reads.Load()
	outboxtest.WaitFor(t, "the sequencer to look at the delayed message", time.Minute, func() bool { return clock.reads.Load() >= reads+5 })
	if n := e.Rows("log"); n != 0 {
		t.Fatalf("%d sequenced before the time", n)
	}
	clock.Advance(time.Second)
	outboxtest.WaitFor(t, "both sequenced once due (asleep until its hourly poll, the sequencer would not wake)", time.Minute, func() bool { return e.Rows("log") == 2 })
	var at time.Time
	if err := e.Pool.QueryRow(context.Background(), "SELECT min(sequenced_at) FROM "+e.Schema+".log").Scan(&at); err != nil {
		t.Fatal(err)
	}
	if held := clock.heldAgainst(at); held.Before(due) {
		t.Fatalf("sequenced against the time %v, before its time %v", held, due)
	}
}

// Thousands of delayed messages, mixed with undelayed ones of the same
// keys, through sequencers stopped and started again: every message is
// sequenced, none before its time, and each key in its publish order. The
// sequencers' clock is the test's, moved in steps: after each step the log
// holds exactly the messages due by then (each key up to its first message
// not yet due), and a message that fell due while no sequencer ran is
// sequenced by the next one.
func TestThousandsOfDelayedMessagesAcrossARestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 8)
	const keys, perKey = 40, 60 // 2,400 messages, about a third delayed
	rng := rand.New(rand.NewPCG(1, 2))
	// An hour ahead of the wall clock: the due times, 200 ms to 2.5 s
	// after the clock's start, are in the future however long publishing
	// takes. In whole milliseconds, as PostgreSQL keeps them (microseconds)
	// and as the steps of the clock are: a message due at a step is due
	// at it in the database too.
	clock := newFakeClockAt(time.Now().Add(time.Hour).Truncate(time.Millisecond))
	start := clock.Now()
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
	// dueBy is what may be sequenced once the clock reads now: of each key,
	// the messages before its first one not yet due.
	dueBy := func(now time.Time) map[string]bool {
		out := map[string]bool{}
		for _, uuids := range want {
			for _, uuid := range uuids {
				if due, ok := dueOf[uuid]; ok && due.After(now) {
					break
				}
				out[uuid] = true
			}
		}
		return out
	}
	run := func() (stop func()) {
		seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, Clock: clock.Now}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- seq.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	// moveTo moves the clock to d after its start and waits until the log
	// holds the messages due by then; it must hold no other.
	moveTo := func(d time.Duration) int {
		t.Helper()
		clock.Set(start.Add(d))
		due := dueBy(start.Add(d))
		outboxtest.WaitFor(t, fmt.Sprintf("the %d messages due %v after the start", len(due), d), time.Minute,
			func() bool { return e.Rows("log") >= len(due) })
		got := sequencedUUIDs(t, e, "orders")
		seen := map[string]bool{}
		for _, uuid := range got {
			if !due[uuid] {
				t.Fatalf("%s sequenced with the clock %v after the start: before its time, %v after the start (or behind a message of its key that is not due)",
					uuid, d, dueOf[uuid].Sub(start))
			}
			if seen[uuid] {
				t.Fatalf("%s sequenced twice", uuid)
			}
			seen[uuid] = true
		}
		if len(got) != len(due) {
			t.Fatalf("%d sequenced with the clock %v after the start, want the %d due", len(got), d, len(due))
		}
		return len(got)
	}
	stop := run()
	moveTo(0) // the undelayed messages before each key's first delayed one
	moveTo(400 * time.Millisecond)
	mid := moveTo(800 * time.Millisecond)
	stop() // with most delayed messages waiting
	if mid == 0 || mid == keys*perKey {
		t.Fatalf("%d of %d sequenced before the restart: the restart proves nothing", mid, keys*perKey)
	}
	// Due while no sequencer runs: the next one sequences them at once.
	clock.Set(start.Add(1500 * time.Millisecond))
	stop = run()
	moveTo(1500 * time.Millisecond)
	moveTo(2000 * time.Millisecond)
	if n := moveTo(2600 * time.Millisecond); n != keys*perKey {
		t.Fatalf("%d of %d sequenced once all were due", n, keys*perKey)
	}
	stop()
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
		if due, ok := dueOf[uuid]; ok {
			if held := clock.heldAgainst(at); held.Before(due) {
				t.Errorf("%s sequenced against the time %v, %v before its time", uuid, held, due.Sub(held))
			}
		}
		got[key] = append(got[key], uuid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, w := range want {
		if !slices.Equal(got[key], w) {
			t.Fatalf("key %s out of its order:\n got %v\nwant %v", key, got[key], w)
		}
	}
}

// Bad input is a typed error, and nothing is set on the message.
func TestDeliverAtRefusesBadInput(t *testing.T) {
	t.Parallel()
	m := message.NewMessage("u", nil)
	for name, err := range map[string]error{
		"a past time":     outbox.DeliverAt(m, time.Now().Add(-time.Minute)),
		"a zero time":     outbox.DeliverAt(m, time.Time{}),
		"a nil message":   outbox.DeliverAt(nil, time.Now().Add(time.Minute)),
		"a zero delay":    outbox.DeliverAfter(m, 0),
		"a nil message ":  outbox.DeliverAfter(nil, time.Minute),
		"Unordered(nil)":  outbox.Unordered(nil),
		"the year 300000": outbox.DeliverAt(m, time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)),
	} {
		if !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, set := m.Metadata[outbox.MetadataDeliverAt]; set {
		t.Fatal("a refused DeliverAt set the metadata")
	}
	// The shortest delay is a delay, never "in the past".
	short := message.NewMessage("short", nil)
	if err := outbox.DeliverAfter(short, time.Nanosecond); err != nil {
		t.Fatalf("DeliverAfter(1ns): %v", err)
	}
	if _, ok := outbox.DeliveryTime(short); !ok {
		t.Fatal("DeliverAfter(1ns) set no time")
	}
	// The latest time an RFC 3339 time can write is accepted.
	if err := outbox.DeliverAt(message.NewMessage("far", nil), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatalf("DeliverAt(9999-12-31): %v", err)
	}
	// A time set by hand that is not one: refused by Publish, nothing written.
	e := newEnv(t)
	e.Register("orders", 1)
	bad := outboxtest.Keyed("bad", "k", 1, "x")
	bad.Metadata.Set(outbox.MetadataDeliverAt, "tomorrow")
	var me *outboxtype.MessageError
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
	t.Parallel()
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
	t.Parallel()
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
