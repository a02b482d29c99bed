package worker

import (
	"time"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/tune"
)

// BackoffConfig sets how long the loop waits after Execute fails: Base after
// the first failure, doubling with every further consecutive failure, capped
// at Max: the shared backoff's curve (backoff.Exponential), spread by
// Jitter when set. The wait reported as Failure.RetryIn is the one waited.
type BackoffConfig struct {
	// Base is the wait after the first failure. Must be > 0.
	Base time.Duration
	// Max caps the wait. Must be >= Base.
	Max time.Duration
	// Jitter, when set, spreads each wait (backoff.Jitter: a random point
	// of its second half), so that the workers a database outage failed at
	// once do not all come back at the same instant. Nil: the curve as it
	// is.
	Jitter func(time.Duration) time.Duration
}

// DefaultBackoff is used when [Config.Backoff] is left zero: 1 s doubling up
// to 1 min.
var DefaultBackoff = BackoffConfig{Base: time.Second, Max: time.Minute}

// Validate returns nil if c is usable, and otherwise a [*tune.ConfigError].
func (c BackoffConfig) Validate() error {
	if c.Base <= 0 {
		return &tune.ConfigError{Field: "Backoff.Base", Reason: "must be > 0, got " + c.Base.String()}
	}
	if c.Max < c.Base {
		return &tune.ConfigError{Field: "Backoff.Max", Reason: "must be >= Backoff.Base (" + c.Base.String() + "), got " + c.Max.String()}
	}
	return nil
}

// Delay returns the wait after failures consecutive failures (failures >= 1),
// before Jitter.
func (c BackoffConfig) Delay(failures int) time.Duration {
	return backoff.Exponential(c.Base, c.Max, failures)
}

// wait is the wait after failures consecutive failures: Delay, spread by
// Jitter when set.
func (c BackoffConfig) wait(failures int) time.Duration {
	d := c.Delay(failures)
	if c.Jitter != nil {
		d = c.Jitter(d)
	}
	return d
}
