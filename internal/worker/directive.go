package worker

import (
	"context"
	"fmt"
	"time"
)

type directiveKind uint8

const (
	kindIdle directiveKind = iota // zero value: the safest default
	kindProceed
	kindSleep
)

// Directive tells [Run] what to do after an [Action.Execute] call. Build one
// with [Proceed], [Idle] or [Sleep]. Directives are comparable with ==; the
// zero Directive is [Idle].
type Directive struct {
	kind  directiveKind
	delay time.Duration
}

// Proceed reports that work was done and more is likely: the next call comes
// after the pacing delay.
func Proceed() Directive { return Directive{kind: kindProceed} }

// Idle reports that there was nothing to do: the next call comes when the
// worker is poked or after the pacing IdleInterval.
func Idle() Directive { return Directive{kind: kindIdle} }

// IdleFor is Idle with a shorter wait: the next call comes when the worker
// is poked or after d, when d is below the pacing IdleInterval (e.g. a
// retry that falls due before then).
func IdleFor(d time.Duration) Directive { return Directive{kind: kindIdle, delay: max(d, 1)} }

// SleepDelay returns the delay of a Sleep directive; ok is false for the
// others.
func (d Directive) SleepDelay() (delay time.Duration, ok bool) {
	return d.delay, d.kind == kindSleep
}

// Delay is when the worker wants its next call at the latest: the delay of
// Sleep and IdleFor, 0 for the others (Proceed, Idle: when poked).
func (d Directive) Delay() time.Duration { return d.delay }

// Proceeds reports a Proceed directive: work was done and more is likely.
func (d Directive) Proceeds() bool { return d.kind == kindProceed }

// Sleep asks for the next call after d exactly (at once if d <= 0), e.g. to
// back off before retrying a batch.
func Sleep(d time.Duration) Directive { return Directive{kind: kindSleep, delay: max(d, 0)} }

// String returns "proceed", "idle" or "sleep(<duration>)".
func (d Directive) String() string {
	switch d.kind {
	case kindProceed:
		return "proceed"
	case kindSleep:
		return fmt.Sprintf("sleep(%v)", d.delay)
	default:
		return "idle"
	}
}

// Action is one unit of a worker's work.
type Action interface {
	// Execute does one round of work and says when to run again. It must
	// honour ctx: once ctx is cancelled it should return promptly. An error
	// makes the loop back off and call again.
	Execute(ctx context.Context) (Directive, error)
}

// ActionFunc adapts an ordinary function to the [Action] interface.
type ActionFunc func(ctx context.Context) (Directive, error)

// Execute calls f(ctx).
func (f ActionFunc) Execute(ctx context.Context) (Directive, error) { return f(ctx) }
