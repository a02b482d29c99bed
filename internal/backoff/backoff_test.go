package backoff_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/millrace/watermill-outbox/internal/backoff"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The unjittered wait doubles from base, stops at the cap, and never
// overflows.
func TestExponentialDoublesUpToTheCap(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct {
		base, max time.Duration
		n         int
		want      time.Duration
	}{
		{100 * ms, 5 * time.Second, -3, 100 * ms},
		{100 * ms, 5 * time.Second, 0, 100 * ms},
		{100 * ms, 5 * time.Second, 1, 100 * ms},
		{100 * ms, 5 * time.Second, 2, 200 * ms},
		{100 * ms, 5 * time.Second, 6, 3200 * ms},
		{100 * ms, 5 * time.Second, 7, 5 * time.Second},
		{100 * ms, 5 * time.Second, math.MaxInt, 5 * time.Second},
		{time.Second, math.MaxInt64, math.MaxInt, math.MaxInt64},
		{time.Second, 500 * ms, 3, time.Second}, // a cap below base: base
		{0, time.Second, 3, 0},
		{-time.Second, time.Second, 3, 0},
	} {
		if got := backoff.Exponential(tt.base, tt.max, tt.n); got != tt.want {
			t.Errorf("Exponential(%v, %v, %d) = %v, want %v", tt.base, tt.max, tt.n, got, tt.want)
		}
	}
}

// Each jittered wait lies in [d/2, d] of the unjittered one, and the waits
// are spread over that range, not all on one edge.
func TestDelayIsJitteredOverHalfToFull(t *testing.T) {
	p := backoff.Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	for n := 1; n <= 10; n++ {
		d := backoff.Exponential(p.Base, p.Max, n)
		lowHalf, highHalf := 0, 0
		for range 200 {
			got := p.Delay(n)
			if got < d/2 || got > d {
				t.Fatalf("Delay(%d) = %v, outside [%v, %v]", n, got, d/2, d)
			}
			if got < d*3/4 {
				lowHalf++
			} else {
				highHalf++
			}
		}
		// 200 uniform draws: each half gets at least 40 but with a
		// probability below 1e-17.
		if lowHalf < 40 || highHalf < 40 {
			t.Fatalf("Delay(%d) is not spread over [d/2, d]: %d draws below 3d/4, %d above", n, lowHalf, highHalf)
		}
	}
	if got := backoff.Jitter(1); got != 1 {
		t.Errorf("Jitter(1ns) = %v", got)
	}
	if got := backoff.Jitter(0); got != 0 {
		t.Errorf("Jitter(0) = %v", got)
	}
}

// The shared default: the first retry 50–100 ms after a failure, a long
// outage retried every 2.5–5 s.
func TestDefaultBounds(t *testing.T) {
	for range 100 {
		if d := backoff.Default.Delay(1); d < 50*time.Millisecond || d > 100*time.Millisecond {
			t.Fatalf("first wait %v", d)
		}
		if d := backoff.Default.Delay(1000); d < 2500*time.Millisecond || d > 5*time.Second {
			t.Fatalf("wait after 1000 failures %v", d)
		}
	}
}

// A Streak counts failures, a success resets it, and its zero value uses
// Default.
func TestStreakCountsAndResets(t *testing.T) {
	var s backoff.Streak
	for n := 1; n <= 8; n++ {
		d := s.Failed()
		want := backoff.Exponential(backoff.Default.Base, backoff.Default.Max, n)
		if s.Failures() != n || d < want/2 || d > want {
			t.Fatalf("failure %d: count %d, wait %v, want within [%v, %v]", n, s.Failures(), d, want/2, want)
		}
	}
	s.Succeeded()
	if d := s.Failed(); s.Failures() != 1 || d > backoff.Default.Base {
		t.Fatalf("after a success: count %d, wait %v, want 1 and at most %v", s.Failures(), d, backoff.Default.Base)
	}
	custom := backoff.Streak{Policy: backoff.Policy{Base: time.Second, Max: time.Second}}
	for range 5 {
		if d := custom.Failed(); d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("a 1s policy waited %v", d)
		}
	}
}

// Retry calls again after each failure, waiting the policy's jittered
// backoff (growing, capped), reports each failure with its count and wait,
// and returns nil at the first success.
func TestRetryBacksOffThenSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := backoff.Policy{Base: time.Second, Max: 4 * time.Second}
		errDown := errors.New("down")
		var calls []time.Time
		type report struct {
			n    int
			wait time.Duration
		}
		var reports []report
		err := backoff.Retry(context.Background(), p, func(context.Context) error {
			calls = append(calls, time.Now())
			if len(calls) <= 5 {
				return errDown
			}
			return nil
		}, func(err error, n int, wait time.Duration) {
			if !errors.Is(err, errDown) {
				t.Errorf("reported %v", err)
			}
			reports = append(reports, report{n, wait})
		})
		if err != nil {
			t.Fatalf("Retry: %v", err)
		}
		if len(calls) != 6 || len(reports) != 5 {
			t.Fatalf("%d calls, %d reports; want 6 and 5", len(calls), len(reports))
		}
		for i, r := range reports {
			d := backoff.Exponential(p.Base, p.Max, i+1)
			if r.n != i+1 || r.wait < d/2 || r.wait > d {
				t.Fatalf("report %d: failure %d, wait %v; want failure %d, wait in [%v, %v]", i, r.n, r.wait, i+1, d/2, d)
			}
			if gap := calls[i+1].Sub(calls[i]); gap != r.wait {
				t.Fatalf("call %d came %v after the previous, the reported wait was %v", i+1, gap, r.wait)
			}
		}
	})
}

// Retry stops when ctx ends, during a wait or because fn failed on it, and
// does not report the error of a call that failed because ctx ended.
func TestRetryStopsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		calls := 0
		err := backoff.Retry(ctx, backoff.Policy{Base: time.Hour, Max: time.Hour}, func(context.Context) error {
			calls++
			return errors.New("down")
		}, nil)
		if !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
			t.Fatalf("Retry: %v after %d calls, want DeadlineExceeded after 1", err, calls)
		}

		ctx2, cancel2 := context.WithCancel(context.Background())
		reported := 0
		err = backoff.Retry(ctx2, backoff.Default, func(ctx context.Context) error {
			cancel2()
			return ctx.Err()
		}, func(error, int, time.Duration) { reported++ })
		if !errors.Is(err, context.Canceled) || reported != 0 {
			t.Fatalf("Retry: %v with %d reports, want Canceled and none", err, reported)
		}
		if err := backoff.Retry(ctx2, backoff.Default, func(context.Context) error { t.Fatal("called on an ended context"); return nil }, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("Retry on an ended context: %v", err)
		}
	})
}

// Sleep waits the whole duration, or until its context ends.
func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !backoff.Sleep(context.Background(), 3*time.Second) || time.Since(start) != 3*time.Second {
			t.Fatalf("Sleep(3s) took %v", time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start = time.Now()
		if backoff.Sleep(ctx, time.Hour) || time.Since(start) != time.Second {
			t.Fatalf("Sleep(1h) with a 1s context: took %v", time.Since(start))
		}
		if backoff.Sleep(ctx, 0) {
			t.Fatal("Sleep(0) on an ended context reported it live")
		}
		if !backoff.Sleep(context.Background(), 0) {
			t.Fatal("Sleep(0) on a live context reported it ended")
		}
	})
}
