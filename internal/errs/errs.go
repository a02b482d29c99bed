// Package errs holds the outbox's error values so that internal packages can
// return them; the root package re-exports each one under the same identity.
package errs

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors; see the re-exports in package outbox for their meaning.
var (
	ErrInvalidName           = errors.New("outbox: invalid name")
	ErrInvalidConfig         = errors.New("outbox: invalid configuration")
	ErrNotFound              = errors.New("outbox: not found")
	ErrInvalidArgument       = errors.New("outbox: invalid argument")
	ErrAlreadyRunning        = errors.New("outbox: already running")
	ErrSchemaTooNew          = errors.New("outbox: database schema is newer than this library")
	ErrPartitionMismatch     = errors.New("outbox: topic already registered with a different partition count")
	ErrInvalidPartitionCount = errors.New("outbox: invalid partition count")
	ErrPayloadTooLarge       = errors.New("outbox: payload too large")
	ErrInvalidMessage        = errors.New("outbox: invalid message")
	ErrPublisherClosed       = errors.New("outbox: publisher closed")
	ErrNilTx                 = errors.New("outbox: nil transaction")
	ErrNoTx                  = errors.New("outbox: no transaction in the message context")
	ErrUnsupportedTx         = errors.New("outbox: unsupported transaction or database handle")
	ErrMixedTx               = errors.New("outbox: messages of one Publish call carry different transactions")
	ErrUnknownTopic          = errors.New("outbox: unknown topic")
	ErrClosed                = errors.New("outbox: closed")
	ErrNotMigrated           = errors.New("outbox: schema not migrated")
	ErrNotInTx               = errors.New("outbox: not a transaction")
	ErrMetadataTooLarge      = errors.New("outbox: metadata too large")
	ErrPublishTooLarge       = errors.New("outbox: one Publish call carries too many bytes")
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

// LimitError reports a message or a Publish call over one of the
// Publisher's size limits; it matches the sentinel of the limit
// (ErrMetadataTooLarge, ErrPublishTooLarge).
type LimitError struct {
	Limit string // the PublisherConfig field: MaxMetadataBytes or MaxPublishBytes
	UUID  string // the message, "" for a whole call
	Size  int    // bytes found (for a call: counted up to the first message over the limit)
	Max   int    // the limit
	kind  error
}

// NewLimitError returns a *LimitError matching kind.
func NewLimitError(kind error, limit, uuid string, size, maxSize int) *LimitError {
	return &LimitError{Limit: limit, UUID: uuid, Size: size, Max: maxSize, kind: kind}
}

// Error says what is over which limit, and what to do.
func (e *LimitError) Error() string {
	what, todo := "this Publish call carries", "split the messages over several Publish calls (in the same transaction, they commit together), or raise the limit"
	if e.UUID != "" {
		what, todo = "message "+e.UUID+" carries", "put large values in the payload, or raise the limit"
	}
	return fmt.Sprintf("%v: %s %d bytes, over PublisherConfig.%s (%d); nothing was written: %s", e.kind, what, e.Size, e.Limit, e.Max, todo)
}

// Is makes errors.Is match the limit's sentinel.
func (e *LimitError) Is(target error) bool { return target == e.kind }

// NotInTxError reports a handle that is not a transaction where one is
// required: a message written through it would not be part of the
// caller's transaction and would survive its rollback.
type NotInTxError struct {
	Type string // the handle's type, e.g. "*pgxpool.Pool"
}

// Error says why the handle is refused and what to pass instead.
func (e *NotInTxError) Error() string {
	return fmt.Sprintf("outbox: %s is not an open transaction: a message written through it would be committed on its own and survive your rollback; begin a transaction and pass the pgx.Tx or *sql.Tx (or a watermill-sql Tx), or set PublisherConfig.OwnTransaction to publish outside one", e.Type)
}

// Is makes errors.Is(err, ErrNotInTx) true.
func (e *NotInTxError) Is(target error) bool { return target == ErrNotInTx }

// NotMigratedError reports a schema that holds no outbox tables (or not
// all of them): outbox.Migrate was never run on it, or it was dropped.
type NotMigratedError struct {
	Schema string
	// Cause is the database error that revealed it, if any.
	Cause error
	// Run is the call that creates the schema's tables, when it is not
	// outbox.Migrate (e.g. inbox.Migrate for an inbox schema).
	Run string
}

func (e *NotMigratedError) Error() string {
	if e.Run != "" {
		return fmt.Sprintf("outbox: schema %q is not migrated: run %s before using it", e.Schema, e.Run)
	}
	return fmt.Sprintf("outbox: schema %q is not migrated: run outbox.Migrate(ctx, db, %q) (or `outbox migrate`) before using it", e.Schema, e.Schema)
}

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Unwrap returns the database error behind it.
func (e *NotMigratedError) Unwrap() error { return e.Cause }

// NameError reports an invalid schema, topic or consumer group name.
type NameError struct {
	Kind   string // "schema", "topic", "group" or "source"
	Name   string
	Reason string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("outbox: invalid %s name %q: %s", e.Kind, e.Name, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidName) true.
func (e *NameError) Is(target error) bool { return target == ErrInvalidName }

// ConfigError reports an impossible configuration value.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("outbox: invalid configuration: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// SchemaVersionError reports a database migrated by a newer release.
type SchemaVersionError struct {
	Schema   string
	Database int // version recorded in the database
	Library  int // newest version this library knows
}

func (e *SchemaVersionError) Error() string {
	return fmt.Sprintf("outbox: schema %q is at version %d, newer than this library's %d: upgrade the library", e.Schema, e.Database, e.Library)
}

// Is makes errors.Is(err, ErrSchemaTooNew) true.
func (e *SchemaVersionError) Is(target error) bool { return target == ErrSchemaTooNew }

// PartitionMismatchError reports a topic registered with another partition
// count than requested.
type PartitionMismatchError struct {
	Topic      string
	Registered int
	Requested  int
}

func (e *PartitionMismatchError) Error() string {
	return fmt.Sprintf("outbox: topic %q has %d partitions, not %d (partition counts cannot change)", e.Topic, e.Registered, e.Requested)
}

// Is makes errors.Is(err, ErrPartitionMismatch) true.
func (e *PartitionMismatchError) Is(target error) bool { return target == ErrPartitionMismatch }

// PayloadTooLargeError reports a message whose payload exceeds the limit.
type PayloadTooLargeError struct {
	UUID  string
	Size  int
	Limit int
}

func (e *PayloadTooLargeError) Error() string {
	return fmt.Sprintf("outbox: message %s: payload of %d bytes exceeds the limit of %d", e.UUID, e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrPayloadTooLarge) true.
func (e *PayloadTooLargeError) Is(target error) bool { return target == ErrPayloadTooLarge }

// MessageError reports a message the outbox cannot store byte-exact.
type MessageError struct {
	UUID   string
	Reason string
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox: message %s: %s", e.UUID, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidMessage) true.
func (e *MessageError) Is(target error) bool { return target == ErrInvalidMessage }

// ErrPoison marks a message that can never be processed (a permanent error):
// the Subscriber takes it out of the stream instead of retrying it.
var ErrPoison = errors.New("outbox: poison message")

// PoisonError carries the cause of a rejection.
type PoisonError struct{ Cause error }

func (e *PoisonError) Error() string {
	if e.Cause == nil {
		return ErrPoison.Error()
	}
	return ErrPoison.Error() + ": " + e.Cause.Error()
}
func (e *PoisonError) Unwrap() []error { return []error{ErrPoison, e.Cause} }

// ErrNotKeySpecific marks a failure that is not the message's own (a broker
// or a database that is down): with key isolation the partition blocks
// and backs off, instead of holding the message's key back.
var ErrNotKeySpecific = errors.New("outbox: failure not specific to the message's key")

// NotKeySpecificError carries such a failure.
type NotKeySpecificError struct{ Cause error }

func (e *NotKeySpecificError) Error() string {
	if e.Cause == nil {
		return ErrNotKeySpecific.Error()
	}
	return e.Cause.Error()
}
func (e *NotKeySpecificError) Unwrap() []error { return []error{ErrNotKeySpecific, e.Cause} }

// ErrHandlerTimeout reports a delivery whose handler did not answer within
// SubscriberConfig.HandlerTimeout (*HandlerTimeoutError). The delivery counts
// as a failed attempt; a late Ack or Nack of it changes nothing.
var ErrHandlerTimeout = errors.New("outbox: handler timed out")

// HandlerTimeoutError is the failure recorded for a delivery whose handler
// did not answer in time.
type HandlerTimeoutError struct {
	Seq     int64
	Timeout time.Duration
}

func (e *HandlerTimeoutError) Error() string {
	return fmt.Sprintf("outbox: the handler of seq %d did not ack or nack within HandlerTimeout (%v): the delivery counts as a failed attempt and is retried; the handler's goroutine is left to finish on its own, and its late answer is ignored", e.Seq, e.Timeout)
}

// Is makes errors.Is(err, ErrHandlerTimeout) true.
func (e *HandlerTimeoutError) Is(target error) bool { return target == ErrHandlerTimeout }

// ErrTxMisuse reports a Transactional handler that left the Subscriber's
// transaction unusable, or tried to end it (*TxMisuseError). The delivery
// counts as a failed attempt and its writes are undone.
var ErrTxMisuse = errors.New("outbox: the handler misused the subscriber's transaction")

// TxMisuseError says what a Transactional handler did to the Subscriber's
// transaction, and what to do instead.
type TxMisuseError struct {
	Seq int64
	// What the handler did.
	What string
	// Cause is the database error that revealed it, if any.
	Cause error
}

func (e *TxMisuseError) Error() string {
	s := fmt.Sprintf("outbox: the handler of seq %d %s", e.Seq, e.What)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Is makes errors.Is(err, ErrTxMisuse) true.
func (e *TxMisuseError) Is(target error) bool { return target == ErrTxMisuse }

// Unwrap returns the database error behind it.
func (e *TxMisuseError) Unwrap() error { return e.Cause }

// ErrPayloadMissing reports a message whose payload was kept apart from
// its log row (payloads of 1 KiB or more are, in the bodies table) and is
// gone: the message cannot be delivered as it was written
// (*PayloadMissingError). Each delivery of it counts as a failed attempt;
// after MaxAttempts it is dead-lettered, never delivered with an empty
// payload.
var ErrPayloadMissing = errors.New("outbox: the message's payload is missing")

// PayloadMissingError names the message whose payload is missing.
type PayloadMissingError struct {
	Topic     string
	Partition int
	Seq       int64
}

func (e *PayloadMissingError) Error() string {
	return fmt.Sprintf("outbox: the payload of seq %d (topic %q, partition %d) is missing from the bodies table: "+
		"the message cannot be delivered as it was written; restore the row from a backup and replay its dead letter, or discard it",
		e.Seq, e.Topic, e.Partition)
}

// Is makes errors.Is(err, ErrPayloadMissing) true.
func (e *PayloadMissingError) Is(target error) bool { return target == ErrPayloadMissing }
