// Package errs holds the helpers that build the outbox's errors (a nil
// argument, a zero value used without its constructor) and the errors that
// carry a cause (PoisonError, NotKeySpecificError). The error values and
// types themselves are those of the public leaf package outboxtype, which
// every package uses directly.
package errs

import (
	"fmt"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// NilArgument reports an argument that is nil where a value is required:
// what names it ("inbox.Process: fn"), todo says what to pass instead. It
// matches ErrInvalidArgument.
func NilArgument(what, todo string) error {
	return fmt.Errorf("%w: %s is nil: %s", sentinel.ErrInvalidArgument, what, todo)
}

// NotConstructed reports a method called on the zero value of a type that
// only its constructor makes usable: typ names the type ("inbox.Inbox"),
// ctor the constructor ("inbox.New"). It matches ErrInvalidArgument.
func NotConstructed(typ, ctor string) error {
	return fmt.Errorf("%w: a zero %s, not created by %s: create it with %s", sentinel.ErrInvalidArgument, typ, ctor, ctor)
}

// PoisonError carries the cause of a rejection.
type PoisonError struct{ Cause error }

func (e *PoisonError) Error() string {
	if e.Cause == nil {
		return sentinel.ErrPoison.Error()
	}
	return sentinel.ErrPoison.Error() + ": " + e.Cause.Error()
}
func (e *PoisonError) Unwrap() []error { return []error{sentinel.ErrPoison, e.Cause} }

// NotKeySpecificError carries a failure that is not the message's own
// (a broker or a database that is down); it matches ErrNotKeySpecific.
type NotKeySpecificError struct{ Cause error }

func (e *NotKeySpecificError) Error() string {
	if e.Cause == nil {
		return sentinel.ErrNotKeySpecific.Error()
	}
	return e.Cause.Error()
}
func (e *NotKeySpecificError) Unwrap() []error { return []error{sentinel.ErrNotKeySpecific, e.Cause} }
