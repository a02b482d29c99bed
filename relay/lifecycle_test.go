package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/backoff/backofftest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/startstop/startstoptest"
	"github.com/millrace/watermill-outbox/partitioning"
	"github.com/millrace/watermill-outbox/relay"
)

// unreachablePool is a pool on a port nobody listens on: every connection
// fails at once, and nothing needs a database.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(outboxtest.Ctx(t), "postgres://outbox@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// The Relay has the one lifecycle: Run once (a second Run while it runs is
// ErrAlreadyRunning, a Run after Close or after Run returned is
// ErrClosed), Close waits for Run and the goroutines it started (the
// retained-WAL check), and is idempotent.
func TestRelayRunsOnceAndCloseWaits(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	pool := unreachablePool(t)
	cfg := relay.Config{Schema: "unreachable", Pool: pool, StatusInterval: 10 * time.Millisecond}

	closedFirst, err := relay.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.CloseThenRun(t, closedFirst)

	r, err := relay.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.RunTwiceThenClose(t, r)
	pool.Close()
	goleak.VerifyNone(t, ignore)
}

// A relay that cannot connect retries with the shared backoff: the n-th
// failure in a row waits within [d/2, d] of 100 ms·2^(n-1), jittered
// (before, exactly 50 ms·2^(n-1) capped by Config.MaxErrorBackoff), and
// each failure is counted in Stats.
func TestRelayBacksOffWithTheSharedBackoff(t *testing.T) {
	pool := unreachablePool(t)
	defer pool.Close()
	logs := &backofftest.Logger{Msg: "Relay failed, retrying"}
	r, err := relay.New(relay.Config{Schema: "unreachable", Pool: pool}, logs)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	rs := logs.WaitFor(t, 5, 30*time.Second)[:5]
	_ = r.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	backofftest.Check(t, backoff.Default, rs, nil)
	if st := r.Stats(); st.Failures < 5 || st.LastError == "" {
		t.Fatalf("Stats after 5 failures: %+v", st)
	}
}

// A relay that appended since its last failure starts its backoff again
// from the shortest wait: a failure after a working stretch is not one of
// a streak. Failures without an append in between keep doubling.
func TestRelayBackoffResetsAfterAnAppend(t *testing.T) {
	b := setup(t, "orders", 2)
	pub := walPublisher(t, b)
	part, err := partitioning.Default().Partition("k", 2)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(uuid string) {
		m := message.NewMessage(uuid, []byte("x"))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "k")
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
	}
	unregister := func() {
		if _, err := b.Pool.Exec(outboxtest.Ctx(t), "DELETE FROM "+b.Schema+".partitions WHERE topic = 'orders' AND partition = $1", part); err != nil {
			t.Fatal(err)
		}
	}
	publish("m1")
	unregister()
	logs := &backofftest.Logger{Msg: "Relay failed, retrying"}
	startRelay(t, b.Pool, b.Schema, nil, logs)
	first := logs.WaitFor(t, 3, 30*time.Second)
	backofftest.Check(t, backoff.Default, first, nil)

	if _, err := b.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+b.Schema+".partitions (topic, partition) VALUES ('orders', $1)", part); err != nil {
		t.Fatal(err)
	}
	waitLog(t, b, "orders", 1)
	failedBefore := len(logs.Retries())
	unregister()
	publish("m2")
	rs := logs.WaitFor(t, failedBefore+2, 30*time.Second)
	backofftest.Check(t, backoff.Default, rs[failedBefore:failedBefore+2], nil)
}
