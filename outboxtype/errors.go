package outboxtype

import (
	"fmt"
	"time"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// LimitError reports a message or a Publish call over one of the
// Publisher's size limits; it matches the sentinel of the limit
// (outbox.ErrMetadataTooLarge, outbox.ErrPublishTooLarge).
type LimitError struct {
	Limit string // the PublisherConfig field: MaxMetadataBytes or MaxPublishBytes
	UUID  string // the message, "" for a whole call
	Size  int    // bytes found (for a call: counted up to the first message over the limit)
	Max   int    // the limit
}

// kind is the sentinel of e's limit.
func (e *LimitError) kind() error {
	if e.Limit == "MaxMetadataBytes" {
		return sentinel.ErrMetadataTooLarge
	}
	return sentinel.ErrPublishTooLarge
}

// Error says what is over which limit, and what to do.
func (e *LimitError) Error() string {
	what, todo := "this Publish call carries", "split the messages over several Publish calls (in the same transaction, they commit together), or raise the limit"
	if e.UUID != "" {
		what, todo = "message "+e.UUID+" carries", "put large values in the payload, or raise the limit"
	}
	return fmt.Sprintf("%v: %s %d bytes, over PublisherConfig.%s (%d); nothing was written: %s", e.kind(), what, e.Size, e.Limit, e.Max, todo)
}

// Is makes errors.Is match the limit's sentinel: outbox.ErrMetadataTooLarge for
// MaxMetadataBytes, outbox.ErrPublishTooLarge for MaxPublishBytes.
func (e *LimitError) Is(target error) bool { return target == e.kind() }

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

// Is makes errors.Is(err, outbox.ErrNotInTx) true.
func (e *NotInTxError) Is(target error) bool { return target == sentinel.ErrNotInTx }

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

// Error says what is wrong.
func (e *NotMigratedError) Error() string {
	if e.Run != "" {
		return fmt.Sprintf("outbox: schema %q is not migrated: run %s before using it", e.Schema, e.Run)
	}
	return fmt.Sprintf("outbox: schema %q is not migrated: run outbox.Migrate(ctx, db, %q) (or `outbox migrate`) before using it", e.Schema, e.Schema)
}

// Is makes errors.Is(err, outbox.ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == sentinel.ErrNotMigrated }

// Unwrap returns the database error behind it.
func (e *NotMigratedError) Unwrap() error { return e.Cause }

// NameError reports an invalid schema, topic or consumer group name.
type NameError struct {
	Kind   string // "schema", "topic", "group" or "source"
	Name   string
	Reason string
}

// Error says what is wrong.
func (e *NameError) Error() string {
	return fmt.Sprintf("outbox: invalid %s name %q: %s", e.Kind, e.Name, e.Reason)
}

// Is makes errors.Is(err, outbox.ErrInvalidName) true.
func (e *NameError) Is(target error) bool { return target == sentinel.ErrInvalidName }

// ConfigError reports an impossible configuration value.
type ConfigError struct {
	Field  string
	Reason string
}

// Error says what is wrong.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("outbox: invalid configuration: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, outbox.ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == sentinel.ErrInvalidConfig }

// SchemaVersionError reports a database migrated by a newer release.
type SchemaVersionError struct {
	Schema   string
	Database int // version recorded in the database
	Library  int // newest version this library knows
}

// Error says what is wrong.
func (e *SchemaVersionError) Error() string {
	return fmt.Sprintf("outbox: schema %q is at version %d, newer than this library's %d: upgrade the library", e.Schema, e.Database, e.Library)
}

// Is makes errors.Is(err, outbox.ErrSchemaTooNew) true.
func (e *SchemaVersionError) Is(target error) bool { return target == sentinel.ErrSchemaTooNew }

// PartitionMismatchError reports a topic registered with another partition
// count than requested.
type PartitionMismatchError struct {
	Topic      string
	Registered int
	Requested  int
}

// Error says what is wrong.
func (e *PartitionMismatchError) Error() string {
	return fmt.Sprintf("outbox: topic %q has %d partitions, not %d (partition counts cannot change)", e.Topic, e.Registered, e.Requested)
}

// Is makes errors.Is(err, outbox.ErrPartitionMismatch) true.
func (e *PartitionMismatchError) Is(target error) bool {
	return target == sentinel.ErrPartitionMismatch
}

// PayloadTooLargeError reports a message whose payload exceeds the limit.
type PayloadTooLargeError struct {
	UUID  string
	Size  int
	Limit int
}

// Error says what is wrong.
func (e *PayloadTooLargeError) Error() string {
	return fmt.Sprintf("outbox: message %s: payload of %d bytes exceeds the limit of %d", e.UUID, e.Size, e.Limit)
}

// Is makes errors.Is(err, outbox.ErrPayloadTooLarge) true.
func (e *PayloadTooLargeError) Is(target error) bool { return target == sentinel.ErrPayloadTooLarge }

// MessageError reports a message the outbox refuses to store: one it
// cannot store byte-exact, one whose outbox metadata was set by hand to a
// value it would misread, or one the configured PartitionKeyFunc or
// Partitioner failed on (Err, then, is their error).
type MessageError struct {
	UUID   string
	Reason string
	// Err is the error of the user's function that failed on the message
	// (PartitionKeyFunc, Partitioner), nil otherwise; errors.Is and
	// errors.As reach it.
	Err error
}

// Error says what is wrong.
func (e *MessageError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("outbox: message %s: %s: %v", e.UUID, e.Reason, e.Err)
	}
	return fmt.Sprintf("outbox: message %s: %s", e.UUID, e.Reason)
}

// Unwrap returns Err.
func (e *MessageError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, outbox.ErrInvalidMessage) true.
func (e *MessageError) Is(target error) bool { return target == sentinel.ErrInvalidMessage }

// HandlerTimeoutError is the failure recorded for a delivery whose handler
// did not answer in time.
type HandlerTimeoutError struct {
	Seq     int64
	Timeout time.Duration
}

// Error says what is wrong.
func (e *HandlerTimeoutError) Error() string {
	return fmt.Sprintf("outbox: the handler of seq %d did not ack or nack within HandlerTimeout (%v): the delivery counts as a failed attempt and is retried; the handler's goroutine is left to finish on its own, and its late answer is ignored", e.Seq, e.Timeout)
}

// Is makes errors.Is(err, outbox.ErrHandlerTimeout) true.
func (e *HandlerTimeoutError) Is(target error) bool { return target == sentinel.ErrHandlerTimeout }

// TxMisuseError says what a Transactional handler did to the Subscriber's
// transaction, and what to do instead.
type TxMisuseError struct {
	Seq int64
	// What the handler did.
	What string
	// Cause is the database error that revealed it, if any.
	Cause error
}

// Error says what is wrong.
func (e *TxMisuseError) Error() string {
	s := fmt.Sprintf("outbox: the handler of seq %d %s", e.Seq, e.What)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Is makes errors.Is(err, outbox.ErrTxMisuse) true.
func (e *TxMisuseError) Is(target error) bool { return target == sentinel.ErrTxMisuse }

// Unwrap returns the database error behind it.
func (e *TxMisuseError) Unwrap() error { return e.Cause }

// PayloadMissingError names the message whose payload is missing.
type PayloadMissingError struct {
	Topic     string
	Partition int
	Seq       int64
}

// Error says what is wrong.
func (e *PayloadMissingError) Error() string {
	return fmt.Sprintf("outbox: the payload of seq %d (topic %q, partition %d) is missing from the bodies table: "+
		"the message cannot be delivered as it was written; restore the row from a backup and replay its dead letter, or discard it",
		e.Seq, e.Topic, e.Partition)
}

// Is makes errors.Is(err, outbox.ErrPayloadMissing) true.
func (e *PayloadMissingError) Is(target error) bool { return target == sentinel.ErrPayloadMissing }
