package worker_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/millrace/watermill-outbox/internal/worker"
)

func TestBulkheadAcquireRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := worker.NewBulkhead(2)
		if err != nil {
			t.Fatal(err)
		}
		if b.Limit() != 2 || b.InUse() != 0 {
			t.Fatalf("Limit/InUse = %d/%d, want 2/0", b.Limit(), b.InUse())
		}
		ctx := context.Background()
		r1, err1 := b.Acquire(ctx)
		r2, err2 := b.Acquire(ctx)
		if err1 != nil || err2 != nil || b.InUse() != 2 {
			t.Fatalf("acquire: %v, %v; in use %d", err1, err2, b.InUse())
		}

		acquired := make(chan func())
		go func() {
			r3, err := b.Acquire(ctx)
			if err != nil {
				t.Error(err)
			}
			acquired <- r3
		}()
		synctest.Wait()
		select {
		case <-acquired:
			t.Fatal("third Acquire succeeded while the bulkhead was full")
		default:
		}

		r1()
		r1() // releasing twice must not free a second slot
		r3 := <-acquired
		if b.InUse() != 2 {
			t.Fatalf("in use = %d after release and re-acquire, want 2", b.InUse())
		}
		r2()
		r3()
		if b.InUse() != 0 {
			t.Fatalf("in use = %d after all releases, want 0", b.InUse())
		}
	})
}

func TestBulkheadAcquireHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := worker.NewBulkhead(1)
		release, err := b.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer release()

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		r, err := b.Acquire(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || r != nil {
			t.Fatalf("Acquire on a full bulkhead = (release %t, %v); want nil, deadline exceeded", r != nil, err)
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Fatalf("waited %v, want exactly the 1m deadline", waited)
		}

		done, cancelDone := context.WithCancel(context.Background())
		cancelDone()
		release() // a slot is free now, but the context is already done
		if r, err := b.Acquire(done); !errors.Is(err, context.Canceled) || r != nil {
			t.Fatalf("Acquire with a cancelled context = (release %t, %v); want nil, canceled", r != nil, err)
		}
		if b.InUse() != 0 {
			t.Fatalf("a failed Acquire holds a slot: in use = %d", b.InUse())
		}
	})
}

func TestNewBulkheadRejectsInvalidLimit(t *testing.T) {
	for _, limit := range []int{0, -1} {
		b, err := worker.NewBulkhead(limit)
		if b != nil {
			t.Fatalf("NewBulkhead(%d) returned a bulkhead", limit)
		}
		requireConfigError(t, err, "Bulkhead limit")
	}
}

func TestBackoffConfigDelay(t *testing.T) {
	c := worker.BackoffConfig{Base: 100 * time.Millisecond, Max: time.Second}
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 1000: time.Second} {
		if got := c.Delay(n); got != want {
			t.Errorf("Delay(%d) = %v, want %v", n, got, want)
		}
	}
	if err := worker.DefaultBackoff.Validate(); err != nil {
		t.Fatalf("DefaultBackoff invalid: %v", err)
	}
}
