// Package backofftest checks, in a component's tests, that the component
// retries with the shared backoff: a [Logger] records the component's
// "retrying" log lines (each carries the fields attempt and retry_in), and
// [Check] verifies them against a backoff.Policy. Tests only.
package backofftest

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/backoff"
)

// Retry is one logged retry.
type Retry struct {
	At      time.Time     // when it was logged
	Attempt int           // the field attempt: consecutive failures so far
	Wait    time.Duration // the field retry_in
	Err     error
}

// Logger is a watermill.LoggerAdapter that records every Error whose
// message contains Msg and that has the fields attempt and retry_in.
// Everything else is dropped.
type Logger struct {
	Msg string

	mu      sync.Mutex
	retries []Retry
}

// Error records a retry.
func (l *Logger) Error(msg string, err error, fields watermill.LogFields) {
	if !strings.Contains(msg, l.Msg) {
		return
	}
	attempt, ok1 := fields["attempt"].(int)
	wait, ok2 := fields["retry_in"].(time.Duration)
	if !ok1 || !ok2 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retries = append(l.retries, Retry{At: time.Now(), Attempt: attempt, Wait: wait, Err: err})
}

// Info drops the line.
func (l *Logger) Info(string, watermill.LogFields) {}

// Debug drops the line.
func (l *Logger) Debug(string, watermill.LogFields) {}

// Trace drops the line.
func (l *Logger) Trace(string, watermill.LogFields) {}

// With returns l.
func (l *Logger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// Retries returns the retries recorded so far.
func (l *Logger) Retries() []Retry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Retry(nil), l.retries...)
}

// WaitFor waits up to timeout for n retries to be recorded and returns
// them, failing t if they do not come.
func (l *Logger) WaitFor(t testing.TB, n int, timeout time.Duration) []Retry {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rs := l.Retries()
		if len(rs) >= n {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d retries logged as %q in %v, want %d: %+v", len(rs), l.Msg, timeout, n, rs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Check fails t unless rs are consecutive failures 1, 2, 3, … of one
// streak, each wait within p's bounds for its attempt ([d/2, d] of
// backoff.Exponential), each retry logged at least the previous one's
// wait after it, and the waits jittered (not all on the lower or the upper
// edge of their range). Every error must match want (nil: any).
func Check(t testing.TB, p backoff.Policy, rs []Retry, want error) {
	t.Helper()
	if len(rs) < 2 {
		t.Fatalf("%d retries; Check needs at least 2", len(rs))
	}
	onLow, onHigh := 0, 0
	for i, r := range rs {
		d := backoff.Exponential(p.Base, p.Max, i+1)
		if r.Attempt != i+1 {
			t.Fatalf("retry %d is attempt %d, want %d (one streak): %+v", i, r.Attempt, i+1, rs)
		}
		if r.Wait < d/2 || r.Wait > d {
			t.Fatalf("attempt %d waits %v, outside the shared backoff's [%v, %v]", r.Attempt, r.Wait, d/2, d)
		}
		if r.Wait == d/2 {
			onLow++
		}
		if r.Wait == d {
			onHigh++
		}
		if i > 0 {
			if gap := r.At.Sub(rs[i-1].At); gap < rs[i-1].Wait {
				t.Fatalf("attempt %d came %v after attempt %d, which said it would wait %v", r.Attempt, gap, rs[i-1].Attempt, rs[i-1].Wait)
			}
		}
		if want != nil && !errors.Is(r.Err, want) {
			t.Fatalf("attempt %d failed with %v, want %v", r.Attempt, r.Err, want)
		}
	}
	if onLow == len(rs) || onHigh == len(rs) {
		t.Fatalf("the waits are not jittered: %+v", rs)
	}
}
