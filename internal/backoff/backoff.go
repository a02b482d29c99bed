// Package backoff is the one retry backoff of the outbox's long-running
// components: the Sequencer, the relay, the retention Vacuum, the notifier's
// reconnect and the Subscriber's join of a consumer group wait
// [Default].Delay(n) after their n-th consecutive failure, and
// internal/worker's BackoffConfig computes its (unjittered, configurable)
// waits with the same [Exponential].
//
// The wait after the n-th consecutive failure is Base·2^(n-1), capped at Max,
// then spread by [Jitter] over [d/2, d], so that many instances failing at
// the same moment (a database restart) do not retry in lockstep. A success
// resets the count: [Streak] keeps it for a loop that retries in place, and
// [Retry] runs the whole "call, back off, call again" loop for a function
// that either succeeds or fails.
package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff: Base after the first failure, doubling
// with every further consecutive failure up to Max, each wait jittered over
// [d/2, d].
type Policy struct {
	// Base is the wait (before jitter) after the first failure.
	Base time.Duration
	// Max caps the wait (before jitter).
	Max time.Duration
}

// Default is the backoff of every long-running component after a database
// or connection error: 100 ms doubling to 5 s, jittered, so the first retry
// comes 50–100 ms after the failure and a long outage is retried every
// 2.5–5 s.
var Default = Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// Delay returns the wait after failures consecutive failures (values below
// 1 count as 1): Jitter(Exponential(p.Base, p.Max, failures)).
func (p Policy) Delay(failures int) time.Duration {
	return Jitter(Exponential(p.Base, p.Max, failures))
}

// Exponential returns base·2^(failures-1) capped at maxWait: base for
// failures of 1 or less (and for a maxWait below base). It never overflows,
// however large failures is; a non-positive base gives 0.
func Exponential(base, maxWait time.Duration, failures int) time.Duration {
	if base <= 0 {
		return 0
	}
	d := base
	for i := 1; i < failures && d < maxWait; i++ {
		if d > math.MaxInt64/2 {
			d = math.MaxInt64
			break
		}
		d *= 2
	}
	return min(d, max(maxWait, base))
}

// Jitter returns a random duration in [d/2, d] (d itself for d of 1 ns or
// less).
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2+1)
}

// Streak counts the consecutive failures of a loop that retries in place.
// Its zero value uses Default.
type Streak struct {
	// Policy gives the waits; the zero Policy means Default.
	Policy Policy
	// Jitter spreads each wait (nil: the package's Jitter); the
	// simulator draws it from its seed.
	Jitter func(time.Duration) time.Duration
	n      int
}

// Failed counts a failure and returns the wait before the next try:
// Policy.Delay(Failures()).
func (s *Streak) Failed() time.Duration {
	if s.n < math.MaxInt {
		s.n++
	}
	p := s.Policy
	if p == (Policy{}) {
		p = Default
	}
	if s.Jitter != nil {
		return s.Jitter(Exponential(p.Base, p.Max, s.n))
	}
	return p.Delay(s.n)
}

// Succeeded resets the count: the next failure waits the shortest time
// again.
func (s *Streak) Succeeded() { s.n = 0 }

// Failures is the number of consecutive failures counted.
func (s *Streak) Failures() int { return s.n }

// Retry calls fn until it returns nil or ctx ends. After the n-th
// consecutive failure it calls onError (when not nil) with the error, n and
// the wait, then waits p.Delay(n); an error fn returned because ctx ended is
// not reported. It returns nil once fn succeeded, and ctx's error when ctx
// ended first.
func Retry(ctx context.Context, p Policy, fn func(context.Context) error, onError func(err error, failures int, wait time.Duration)) error {
	s := Streak{Policy: p}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := s.Failed()
		if onError != nil {
			onError(err, s.Failures(), wait)
		}
		if !Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// Sleep waits d, or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
