// Package errs gives the internal packages the outbox's error values, which
// are those of the public leaf package outboxtype (the same identities, so
// errors.Is and errors.As work across packages), and the helpers that build
// errors matching them.
package errs

import (
	"fmt"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// The error values (outboxtype's).
var (
	ErrInvalidName           = outboxtype.ErrInvalidName
	ErrInvalidConfig         = outboxtype.ErrInvalidConfig
	ErrSchemaTooNew          = outboxtype.ErrSchemaTooNew
	ErrPartitionMismatch     = outboxtype.ErrPartitionMismatch
	ErrInvalidPartitionCount = outboxtype.ErrInvalidPartitionCount
	ErrPayloadTooLarge       = outboxtype.ErrPayloadTooLarge
	ErrInvalidMessage        = outboxtype.ErrInvalidMessage
	ErrPublisherClosed       = outboxtype.ErrPublisherClosed
	ErrNilTx                 = outboxtype.ErrNilTx
	ErrNoTx                  = outboxtype.ErrNoTx
	ErrUnsupportedTx         = outboxtype.ErrUnsupportedTx
	ErrMixedTx               = outboxtype.ErrMixedTx
	ErrUnknownTopic          = outboxtype.ErrUnknownTopic
	ErrClosed                = outboxtype.ErrClosed
	ErrNotMigrated           = outboxtype.ErrNotMigrated
	ErrNotInTx               = outboxtype.ErrNotInTx
	ErrMetadataTooLarge      = outboxtype.ErrMetadataTooLarge
	ErrPublishTooLarge       = outboxtype.ErrPublishTooLarge
	ErrPoison                = outboxtype.ErrPoison
	ErrNotKeySpecific        = outboxtype.ErrNotKeySpecific
	ErrHandlerTimeout        = outboxtype.ErrHandlerTimeout
	ErrPayloadMissing        = outboxtype.ErrPayloadMissing
	ErrTxMisuse              = outboxtype.ErrTxMisuse
	ErrNotFound              = outboxtype.ErrNotFound
	ErrInvalidArgument       = outboxtype.ErrInvalidArgument
	ErrAlreadyRunning        = outboxtype.ErrAlreadyRunning
	ErrWALLevel              = outboxtype.ErrWALLevel
	ErrNoSlot                = outboxtype.ErrNoSlot
)

// The structured errors (outboxtype's).
type (
	LimitError             = outboxtype.LimitError
	NotInTxError           = outboxtype.NotInTxError
	NotMigratedError       = outboxtype.NotMigratedError
	NameError              = outboxtype.NameError
	ConfigError            = outboxtype.ConfigError
	SchemaVersionError     = outboxtype.SchemaVersionError
	PartitionMismatchError = outboxtype.PartitionMismatchError
	PayloadTooLargeError   = outboxtype.PayloadTooLargeError
	MessageError           = outboxtype.MessageError
	HandlerTimeoutError    = outboxtype.HandlerTimeoutError
	TxMisuseError          = outboxtype.TxMisuseError
	PayloadMissingError    = outboxtype.PayloadMissingError
)

// NilArgument reports an argument that is nil where a value is required:
// what names it ("inbox.Process: fn"), todo says what to pass instead. It
// matches ErrInvalidArgument.
func NilArgument(what, todo string) error {
	return fmt.Errorf("%w: %s is nil: %s", ErrInvalidArgument, what, todo)
}

// NotConstructed reports a method called on the zero value of a type that
// only its constructor makes usable: typ names the type ("inbox.Inbox"),
// ctor the constructor ("inbox.New"). It matches ErrInvalidArgument.
func NotConstructed(typ, ctor string) error {
	return fmt.Errorf("%w: a zero %s, not created by %s: create it with %s", ErrInvalidArgument, typ, ctor, ctor)
}

// PoisonError carries the cause of a rejection.
type PoisonError struct{ Cause error }

func (e *PoisonError) Error() string {
	if e.Cause == nil {
		return ErrPoison.Error()
	}
	return ErrPoison.Error() + ": " + e.Cause.Error()
}
func (e *PoisonError) Unwrap() []error { return []error{ErrPoison, e.Cause} }

// NotKeySpecificError carries such a failure.
type NotKeySpecificError struct{ Cause error }

func (e *NotKeySpecificError) Error() string {
	if e.Cause == nil {
		return ErrNotKeySpecific.Error()
	}
	return e.Cause.Error()
}
func (e *NotKeySpecificError) Unwrap() []error { return []error{ErrNotKeySpecific, e.Cause} }
