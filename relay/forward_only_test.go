package relay_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// pendingRows lists topic/uuid of pending's rows of topic in id order,
// each with whether it holds its key back and whether it is delayed.
func pendingRows(t *testing.T, b *outboxtest.Bundle, topic string) []string {
	t.Helper()
	rows, err := b.Pool.Query(context.Background(), "SELECT uuid, holds, deliver_at IS NOT NULL FROM "+b.Schema+".pending WHERE topic = $1 ORDER BY id", topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u string
		var holds, delayed bool
		if err := rows.Scan(&u, &holds, &delayed); err != nil {
			t.Fatal(err)
		}
		if holds {
			u += " holds"
		}
		if delayed {
			u += " delayed"
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// In the log-based mode, the relay puts every message of a forwarder-only
// topic (outbox.ForwardOnly) into pending, in commit order, where its
// Forwarder reads it, and never into the log; the other topics' messages
// go into the log as before, in the same append. It wakes the forwarders
// on the pending channel (payload names.RelayedPayload: they read at once),
// whether the append is a transaction with COPY
// (a large payload of the other topic) or pending alone (one statement).
// A forwarder-only topic registered after the relay read the topics is
// recognised too: the log statements refuse its partitions and the relay
// reads the topics again.
func TestRelayPutsForwarderOnlyTopicsIntoPending(t *testing.T) {
	b := setup(t, "payments", 2)
	ctx := outboxtest.Ctx(t)
	if err := outbox.RegisterTopic(ctx, b.Pool, b.Schema, "orders", 2, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
	listen, err := pgx.Connect(ctx, b.Pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(context.Background())
	if _, err := listen.Exec(ctx, "LISTEN "+pgx.Identifier{names.PendingChannel(b.Schema)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	woken := func(what string) {
		t.Helper()
		n, err := listen.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("no notification on the pending channel after %s: %v", what, err)
		}
		if n.Payload != names.RelayedPayload {
			t.Fatalf("the notification after %s says %q, want %q (the forwarders go at once)", what, n.Payload, names.RelayedPayload)
		}
	}
	startRelay(t, b.Pool, b.Schema, nil, nil)
	pub := walPublisher(t, b)

	// One transaction with both topics and a large payload: the append's
	// transaction path.
	large := outboxtest.Keyed("p0", "a", 0, strings.Repeat("x", 2048))
	if err := pub.Publish("payments", large); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", outboxtest.Keyed("a0", "a", 0, "x"), outboxtest.Keyed("a1", "a", 1, "x")); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "the first messages appended", time.Minute, func() bool { return b.Rows("log") == 1 && b.Rows("pending") == 2 })
	woken("an append with the log")

	// Only the forwarder-only topic: one statement, a delayed message
	// holding its key back and the next of its key after it, in order.
	d := outboxtest.Keyed("a-delayed", "a", 3, "x")
	if err := outbox.DeliverAt(d, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", outboxtest.Keyed("a2", "a", 2, "x"), d, outboxtest.Keyed("a4", "a", 4, "x"), outboxtest.Keyed("b0", "b", 0, "x")); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "the second transaction appended", time.Minute, func() bool { return b.Rows("pending") == 6 })
	woken("an append into pending alone")
	if got, want := pendingRows(t, b, "orders"), []string{"a0", "a1", "a2", "a-delayed holds delayed", "a4", "b0"}; !slices.Equal(got, want) {
		t.Fatalf("pending: %v, want %v", got, want)
	}
	if got, want := logOrder(t, b), []string{"p0"}; !slices.Equal(got, want) {
		t.Fatalf("log: %v, want %v", got, want)
	}
	if n := b.Int("SELECT coalesce(sum(last_seq), 0) FROM " + b.Schema + ".partitions WHERE topic = 'orders'"); n != 0 {
		t.Fatalf("the forwarder-only topic's partitions were numbered up to %d by the relay; its forwarder numbers them", n)
	}

	// Registered while the relay runs, after it read the topics.
	if err := outbox.RegisterTopic(ctx, b.Pool, b.Schema, "refunds", 1, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("refunds", outboxtest.Keyed("r0", "c", 0, "x")); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "the new topic's message appended", time.Minute, func() bool { return b.Rows("pending") == 7 })
	if got := pendingRows(t, b, "refunds"); !slices.Equal(got, []string{"r0"}) {
		t.Fatalf("pending of the topic registered later: %v, want [r0]", got)
	}
	if got := logOrder(t, b); !slices.Equal(got, []string{"p0"}) {
		t.Fatalf("log after the topic registered later: %v, want [p0]", got)
	}
}
