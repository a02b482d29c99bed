package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

// Config configures [Run]. Only Pacing and Backoff have defaults; every
// other field is optional.
type Config struct {
	// Name identifies the worker in [Failure] reports.
	Name string
	// Pacing sets the waits after Proceed and Idle. If left zero,
	// tune.Default.Pacing() is used.
	Pacing tune.Pacing
	// Backoff sets the waits after failed calls. If left zero,
	// [DefaultBackoff] is used.
	Backoff BackoffConfig
	// Bulkhead, if set, must grant a slot before each Execute call.
	Bulkhead *Bulkhead
	// Poker, if set, wakes the worker early while it is idle.
	Poker *Poker
	// OnFailure, if set, is called on the worker's goroutine after every
	// failed or panicking Execute call, before the backoff wait. It must not
	// block for long.
	OnFailure func(Failure)
}

// Failure describes one failed Execute call, as passed to
// [Config.OnFailure].
type Failure struct {
	// Worker is [Config.Name].
	Worker string
	// Err is the error Execute returned, or a [*PanicError] if it panicked.
	Err error
	// Consecutive is the number of failed calls in a row, this one included.
	Consecutive int
	// RetryIn is how long the loop waits before the next call.
	RetryIn time.Duration
}

// PanicError reports a panic recovered from [Action.Execute].
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the goroutine's stack trace at the time of the panic.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string {
	return fmt.Sprintf("worker: action panicked: %v", e.Value)
}

// Unwrap returns the panic value if it is an error, so errors.Is and
// errors.As see through the panic.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// withDefaults returns c with zero Pacing and Backoff replaced by defaults.
func (c Config) withDefaults() Config {
	if c.Pacing == (tune.Pacing{}) {
		c.Pacing = tune.Default.Pacing()
	}
	if c.Backoff.Base == 0 && c.Backoff.Max == 0 {
		jitter := c.Backoff.Jitter
		c.Backoff = DefaultBackoff
		c.Backoff.Jitter = jitter
	}
	return c
}

// Validate returns nil if c, with defaults applied, is usable, and
// otherwise a [*tune.ConfigError] (matching [tune.ErrInvalidConfig]).
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := c.Pacing.Validate(); err != nil {
		var ce *tune.ConfigError
		if errors.As(err, &ce) {
			return &tune.ConfigError{Field: "Pacing." + ce.Field, Reason: ce.Reason}
		}
		return err
	}
	return c.Backoff.Validate()
}

// Run calls action.Execute in a loop, as described in the package
// documentation, until ctx is cancelled; then it returns nil. It returns an
// error matching [tune.ErrInvalidConfig] at once, without calling
// Execute, if cfg is invalid or action is nil.
func Run(ctx context.Context, cfg Config, action Action) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if action == nil {
		return &tune.ConfigError{Field: "action", Reason: "must not be nil"}
	}
	l := loop{cfg: cfg.withDefaults(), action: action}
	l.idleWait = l.cfg.Pacing.IdleInterval
	for {
		wait, wakeOnPoke, ok := l.step(ctx)
		if !ok {
			return nil
		}
		stretchable := wakeOnPoke && wait == l.idleWait && l.cfg.Poker != nil
		poked, ok := l.pause(ctx, wait, wakeOnPoke)
		if !ok {
			return nil
		}
		l.idleTimedOut = stretchable && !poked
		l.poked = poked
	}
}

// How far an idle worker with a poke source stretches its safety-net poll
// (see loop.idleWait), or IdleInterval when longer.
const (
	// maxIdleStretch: while the pokes have announced all the work the
	// worker found, so a quiet partition costs a query per 30 s.
	maxIdleStretch = 30 * time.Second
	// missedStretch: once a poll that no poke asked for found work (the
	// pokes missed it: a sequencer that does not notify), until a poke
	// announces work again.
	missedStretch = time.Second
)

type loop struct {
	cfg      Config
	action   Action
	streak   int // consecutive Proceeds
	failures int // consecutive failed calls
	// idleWait is the idle poll period: Pacing.IdleInterval, doubled
	// after every idle poll that found nothing while the worker has a
	// poke source, because the pokes then tell it of new work: up to
	// maxIdleStretch, or missedStretch once a poll that no poke asked for
	// found work (the pokes missed something, e.g. a sequencer that does
	// not notify), until a poked call finds work again; back to
	// IdleInterval at such a find. So idle partitions cost almost nothing,
	// work that comes without a poke after a long quiet spell waits at
	// most maxIdleStretch, and once the worker has seen that happen at
	// most missedStretch (IdleInterval when longer).
	idleWait time.Duration
	// idleTimedOut: the last pause was an idle wait that ended by its
	// timer, not by a poke.
	idleTimedOut bool
	// poked: the last pause ended by a poke.
	poked bool
	// missed: a poll that no poke asked for found work since the last
	// poked call that did.
	missed bool
}

// stretch is how far the idle poll may stretch now.
func (l *loop) stretch() time.Duration {
	if l.missed {
		return max(missedStretch, l.cfg.Pacing.IdleInterval)
	}
	return max(maxIdleStretch, l.cfg.Pacing.IdleInterval)
}

// step makes one Execute call and works out the wait before the next one.
// ok is false once ctx is done.
func (l *loop) step(ctx context.Context) (wait time.Duration, wakeOnPoke, ok bool) {
	if ctx.Err() != nil {
		return 0, false, false
	}
	dir, err := l.execute(ctx)
	if ctx.Err() != nil {
		return 0, false, false // stopping: the error, if any, is the cancellation
	}
	if err != nil {
		l.streak = 0
		if l.failures < math.MaxInt {
			l.failures++
		}
		wait = l.cfg.Backoff.wait(l.failures)
		if l.cfg.OnFailure != nil {
			l.cfg.OnFailure(Failure{Worker: l.cfg.Name, Err: err, Consecutive: l.failures, RetryIn: wait})
		}
		return wait, false, true
	}
	l.failures = 0
	switch {
	case l.idleTimedOut && dir.kind == kindIdle:
		l.idleWait = min(2*l.idleWait, l.stretch())
	case l.idleTimedOut:
		l.idleWait, l.missed = l.cfg.Pacing.IdleInterval, true
	case l.poked && dir.kind != kindIdle:
		l.missed = false
	}
	switch dir.kind {
	case kindProceed:
		if l.streak < math.MaxInt {
			l.streak++
		}
		return l.cfg.Pacing.ProceedDelay(l.streak), false, true
	case kindSleep:
		l.streak = 0
		return dir.delay, false, true
	default:
		l.streak = 0
		if dir.delay > 0 && dir.delay < l.idleWait {
			return dir.delay, true, true // IdleFor
		}
		return l.idleWait, true, true
	}
}

// execute acquires a bulkhead slot and calls the action, turning a panic
// into a *PanicError. The slot is released even if the action panics.
func (l *loop) execute(ctx context.Context) (dir Directive, err error) {
	if l.cfg.Bulkhead != nil {
		release, err := l.cfg.Bulkhead.Acquire(ctx)
		if err != nil {
			return Directive{}, err
		}
		defer release()
	}
	defer func() {
		if v := recover(); v != nil {
			dir, err = Directive{}, &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return l.action.Execute(ctx)
}

// pause waits for d (or, if wakeOnPoke, until poked) and reports whether it
// was poked and whether the loop should go on, i.e. ctx is still live.
func (l *loop) pause(ctx context.Context, d time.Duration, wakeOnPoke bool) (poked, ok bool) {
	if d <= 0 {
		return false, ctx.Err() == nil
	}
	var poke <-chan struct{}
	if wakeOnPoke {
		poke = l.cfg.Poker.wake()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-timer.C:
	case <-poke:
		poked = true
	}
	return poked, ctx.Err() == nil
}
