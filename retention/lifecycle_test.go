package retention_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/backoff/backofftest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/startstop/startstoptest"
	"github.com/millrace/watermill-outbox/retention"
)

// unreachablePool is a pool on a port nobody listens on: every statement
// fails at once, and nothing needs a database.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(outboxtest.Ctx(t), "postgres://outbox@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// The Vacuum has the one lifecycle: Run once (a second Run while it runs
// is ErrAlreadyRunning; a Run after Close, or after a Run that returned
// because its context ended, is ErrClosed), Close waits for Run and is
// idempotent.
func TestVacuumRunsOnceAndCloseWaits(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	pool := unreachablePool(t)
	cfg := retention.Config{Schema: "unreachable", Pool: pool, Interval: time.Hour}

	ended, err := retention.NewVacuum(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ended.Run(ctx); err != nil {
		t.Fatalf("Run on an ended context: %v", err)
	}
	if err := ended.Run(outboxtest.Ctx(t)); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Run after a Run returned: %v, want ErrClosed", err)
	}

	v, err := retention.NewVacuum(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.RunTwiceThenClose(t, v)
	pool.Close()
	goleak.VerifyNone(t, ignore)
}

// A failed pass is retried with the shared backoff (the n-th failure in a
// row waits within [d/2, d] of 100 ms·2^(n-1), jittered), not after
// Interval as before: with an Interval of an hour, five failures come
// within seconds.
func TestVacuumBacksOffWithTheSharedBackoff(t *testing.T) {
	pool := unreachablePool(t)
	defer pool.Close()
	logs := &backofftest.Logger{Msg: "Vacuum pass failed, retrying"}
	v, err := retention.NewVacuum(retention.Config{Schema: "unreachable", Pool: pool, Interval: time.Hour}, logs)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- v.Run(context.Background()) }()
	rs := logs.WaitFor(t, 5, 30*time.Second)[:5]
	_ = v.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	backofftest.Check(t, backoff.Default, rs, nil)
}
