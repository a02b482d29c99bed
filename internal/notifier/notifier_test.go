package notifier_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/backoff/backofftest"
	"github.com/millrace/watermill-outbox/internal/notifier"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// received collects one subscription's payloads.
type received chan string

func (r received) fn(payload string) {
	select {
	case r <- payload:
	default: // a callback must not block
	}
}

func (r received) next(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case got := <-r:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("no notification %q", want)
		}
	}
}

func listeners(t *testing.T, pool *pgxpool.Pool, channel string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity a
		WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.query LIKE 'LISTEN %' || $1 || '%'`, channel).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func notify(t *testing.T, pool *pgxpool.Pool, channel, payload string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Every component of a process on one pool shares one LISTEN connection,
// across channels (and so across schemas), and each subscriber gets every
// notification of its channel.
func TestOneConnectionFansOutToEverySubscriber(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")) // the test's pool, closed by its cleanup
	pool := pgtest.Pool(t)
	a, b, c := make(received, 16), make(received, 16), make(received, 16)
	sa := notifier.Listen(pool, "ch_one", nil, a.fn)
	a.next(t, "") // listening
	sb := notifier.Listen(pool, "ch_one", nil, b.fn)
	b.next(t, "")
	sc := notifier.Listen(pool, "ch_two", nil, c.fn)
	c.next(t, "")

	notify(t, pool, "ch_one", "hello")
	a.next(t, "hello")
	b.next(t, "hello")
	notify(t, pool, "ch_two", "other")
	c.next(t, "other")

	var backends int
	if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND (query LIKE 'LISTEN %' OR query LIKE 'UNLISTEN %')`).Scan(&backends); err != nil {
		t.Fatal(err)
	}
	if backends != 1 {
		t.Fatalf("%d backends listen for 3 subscriptions on one pool, want 1", backends)
	}

	// Dropping a channel's last subscriber unlistens it on the live
	// connection; the others go on.
	sc.Unlisten()
	sa.Unlisten()
	notify(t, pool, "ch_one", "again")
	b.next(t, "again")
	select {
	case got := <-a:
		t.Fatalf("an unlistened subscription got %q", got)
	default:
	}
	sb.Unlisten()
	waitFor(t, "the LISTEN connection to close", func() bool { return listeners(t, pool, "ch_") == 0 })
}

// A lost connection is re-established, every channel listened to again,
// and every callback told to re-poll ("") before new notifications arrive.
func TestReconnectsAndAsksForARepoll(t *testing.T) {
	pool := pgtest.Pool(t)
	r := make(received, 16)
	s := notifier.Listen(pool, "ch_reconnect", nil, r.fn)
	defer s.Unlisten()
	r.next(t, "")
	var killed int
	if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %ch_reconnect%'`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listening backends, want 1", killed)
	}
	r.next(t, "") // after the reconnect
	waitFor(t, "the channel to be listened to again", func() bool { return listeners(t, pool, "ch_reconnect") == 1 })
	notify(t, pool, "ch_reconnect", "after")
	r.next(t, "after")
}

// A channel subscribed to while the listener waits on the connection is
// listened to at once (the wait is interrupted), and the channels already
// listened to keep working.
func TestAddingAChannelWhileWaitingIsListenedAtOnce(t *testing.T) {
	pool := pgtest.Pool(t)
	first := make(received, 16)
	s1 := notifier.Listen(pool, "ch_first", nil, first.fn)
	defer s1.Unlisten()
	first.next(t, "")
	// The listener is now blocked in WaitForNotification; a new channel
	// must interrupt it.
	second := make(received, 16)
	s2 := notifier.Listen(pool, "ch_second", nil, second.fn)
	defer s2.Unlisten()
	second.next(t, "")
	notify(t, pool, "ch_second", "x")
	second.next(t, "x")
	notify(t, pool, "ch_first", "y")
	first.next(t, "y")
}

// switchablePool is a pool on the test server whose new connections fail
// while down is set.
func switchablePool(t *testing.T, down *atomic.Bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if down.Load() {
			return errors.New("the database is down (test)")
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// The listener reconnects with the shared backoff: the n-th failure in a
// row waits within [d/2, d] of 100 ms·2^(n-1), jittered (before, exactly
// 100 ms·2^(n-1) up to 5 s, and never reset). A connection that held for
// longer than the longest wait starts a new streak when it is lost. The
// last Unlisten ends the listener's goroutine.
func TestReconnectBacksOffWithTheSharedBackoff(t *testing.T) {
	notifier.SetHeldLongEnough(t, 300*time.Millisecond)
	var down atomic.Bool
	down.Store(true)
	pool := switchablePool(t, &down)
	ignore := goleak.IgnoreCurrent()
	logs := &backofftest.Logger{Msg: "LISTEN connection lost, reconnecting"}
	r := make(received, 16)
	s := notifier.Listen(pool, "ch_backoff", logs, r.fn)
	backofftest.Check(t, backoff.Default, logs.WaitFor(t, 4, 30*time.Second)[:4], nil)

	down.Store(false)
	r.next(t, "") // connected and listening
	failedBefore := len(logs.Retries())
	time.Sleep(400 * time.Millisecond) // the connection holds
	var killed int
	if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %ch_backoff%'`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listening backends, want 1", killed)
	}
	rs := logs.WaitFor(t, failedBefore+1, 30*time.Second)
	if a := rs[failedBefore].Attempt; a != 1 {
		t.Fatalf("the loss of a connection that held is attempt %d of its streak, want 1", a)
	}
	r.next(t, "") // reconnected
	s.Unlisten()
	goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// Live tells whether a notification would reach the subscription: false
// while the connection cannot be made, true once the channel is listened
// to (before its "" call), false from the loss of the connection until it
// is listened to again.
func TestLiveWhileTheChannelIsListenedTo(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	pool := switchablePool(t, &down)
	admin := pgtest.Pool(t)
	r := make(received, 16)
	s := notifier.Listen(pool, "ch_live", nil, r.fn)
	defer s.Unlisten()
	if s.Live() {
		t.Fatal("live before any connection could be made")
	}
	down.Store(false)
	r.next(t, "")
	if !s.Live() {
		t.Fatal("not live after its first LISTEN")
	}
	down.Store(true) // the reconnect fails until allowed again
	var killed int
	if err := admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %ch_live%'`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listening backends, want 1", killed)
	}
	waitFor(t, "the subscription to see the connection lost", func() bool { return !s.Live() })
	down.Store(false)
	r.next(t, "") // reconnected and listening again
	if !s.Live() {
		t.Fatal("not live after the reconnect")
	}
}
