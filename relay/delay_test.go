package relay_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// logOrder lists the uuids of the log of b, in seq order per partition.
func logOrder(t *testing.T, b *outboxtest.Bundle) []string {
	t.Helper()
	rows, err := b.Pool.Query(context.Background(), "SELECT uuid FROM "+b.Schema+".log ORDER BY partition, seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

// In the log-based mode, the relay puts a delayed message whose time has
// not come into pending, with the later messages of its key (also those
// published in later transactions), and appends the others at once; the
// sequencer moves the waiting ones when due, in their order. The message is
// due in an hour, so that it is not due yet however slow the machine; the
// sequencer's clock is the test's, moved to that hour.
func TestRelayHoldsDelayedMessagesAndTheirKeysForTheSequencer(t *testing.T) {
	b := setup(t, "orders", 1)
	startRelay(t, b.Pool, b.Schema, nil, nil)
	pub := walPublisher(t, b)
	due := time.Now().Add(time.Hour)
	d := outboxtest.Keyed("a-delayed", "a", 1, "x")
	if err := outbox.DeliverAt(d, due); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", outboxtest.Keyed("a0", "a", 0, "x"), d, outboxtest.Keyed("a2", "a", 2, "x"), outboxtest.Keyed("b1", "b", 1, "x")); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "the undelayed messages appended", time.Minute, func() bool { return b.Rows("log") == 2 })
	if err := pub.Publish("orders", outboxtest.Keyed("a3", "a", 3, "x"), outboxtest.Keyed("b2", "b", 2, "x")); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "b2 appended", time.Minute, func() bool { return b.Rows("log") == 3 })
	if got, want := logOrder(t, b), []string{"a0", "b1", "b2"}; !slices.Equal(got, want) {
		t.Fatalf("log before the time: %v, want %v", got, want)
	}
	if n := b.Rows("pending"); n != 3 {
		t.Fatalf("%d messages waiting in pending, want 3 (the delayed one and a's two after it)", n)
	}
	var clock atomic.Int64 // the sequencer's, in Unix nanoseconds
	clock.Store(time.Now().UnixNano())
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: b.Schema, Pool: b.Pool,
		Clock: func() time.Time { return time.Unix(0, clock.Load()) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := seq.SequenceAll(outboxtest.Ctx(t)); err != nil || n != 0 {
		t.Fatalf("sequenced %d before the time (%v), want none", n, err)
	}
	clock.Store(due.UnixNano())
	done := make(chan error, 1)
	go func() { done <- seq.Run(context.Background()) }()
	t.Cleanup(func() { _ = seq.Close(); <-done })
	outboxtest.WaitFor(t, "the waiting messages sequenced once due", time.Minute, func() bool { return b.Rows("log") == 6 })
	if got, want := logOrder(t, b), []string{"a0", "b1", "b2", "a-delayed", "a2", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("log once due: %v, want %v", got, want)
	}
	// With nothing waiting any more, a's next message is appended at once.
	if err := pub.Publish("orders", outboxtest.Keyed("a4", "a", 4, "x")); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "a4 appended", time.Minute, func() bool { return b.Rows("log") == 7 })
}
