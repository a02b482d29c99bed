package outboxtype

import (
	"errors"
	"fmt"
	"time"
)

// Errors returned by watermill-outbox. Each can be matched with errors.Is;
// the structured ones (the types below) can also be taken apart with
// errors.As. Package outbox and the other packages return these very
// values (outbox.ErrInvalidConfig is ErrInvalidConfig).
var (
	// ErrInvalidName: a schema, topic or consumer group name is not allowed
	// (*NameError).
	ErrInvalidName = errors.New("outbox: invalid name")
	// ErrInvalidConfig: a configuration value is impossible (*ConfigError).
	ErrInvalidConfig = errors.New("outbox: invalid configuration")
	// ErrSchemaTooNew: the database was migrated by a newer release
	// (*SchemaVersionError).
	ErrSchemaTooNew = errors.New("outbox: database schema is newer than this library")
	// ErrPartitionMismatch: a topic exists with another partition count
	// (*PartitionMismatchError).
	ErrPartitionMismatch = errors.New("outbox: topic already registered with a different partition count")
	// ErrInvalidPartitionCount: a partition count outside 1..1024.
	ErrInvalidPartitionCount = errors.New("outbox: invalid partition count")
	// ErrPayloadTooLarge: a payload exceeds PublisherConfig.MaxPayloadBytes
	// (*PayloadTooLargeError).
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	// ErrInvalidMessage: a message is nil, or cannot be stored byte-exact,
	// e.g. metadata with a NUL byte or invalid UTF-8 (*MessageError).
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrPublisherClosed: Publish was called after Close.
	ErrPublisherClosed = errors.New("outbox: publisher closed")
	// ErrNilTx: a nil transaction was given.
	ErrNilTx = errors.New("outbox: nil transaction")
	// ErrNoTx: a message context carries no transaction (outbox.WithTx) and the
	// publisher is not allowed to open its own.
	ErrNoTx = errors.New("outbox: no transaction in the message context")
	// ErrUnsupportedTx: the transaction or database handle is of a type the
	// outbox cannot use.
	ErrUnsupportedTx = errors.New("outbox: unsupported transaction or database handle")
	// ErrMixedTx: the messages of one Publish call carry different
	// transactions in their contexts.
	ErrMixedTx = errors.New("outbox: messages of one Publish call carry different transactions")
	// ErrUnknownTopic: the topic is not registered; register it with
	// outbox.RegisterTopic (or: outbox topics register) before use.
	ErrUnknownTopic = errors.New("outbox: unknown topic")
	// ErrForwardOnly: a Subscriber was asked to read a topic registered
	// with outbox.ForwardOnly, whose messages only its Forwarder reads.
	ErrForwardOnly = errors.New("outbox: the topic is forwarder-only")
	// ErrClosed: a component was used after Close.
	ErrClosed = errors.New("outbox: closed")
	// ErrNotMigrated: the schema holds no outbox tables; run outbox.Migrate first
	// (*NotMigratedError).
	ErrNotMigrated = errors.New("outbox: schema not migrated")
	// ErrNotInTx: a handle given as the caller's transaction (outbox.WithTx,
	// outbox.NewTxPublisher) is not one, so a message written through it would
	// survive the caller's rollback (*NotInTxError): a *pgxpool.Pool or
	// *pgxpool.Conn, a *sql.DB, a *sql.Conn (always: database/sql cannot
	// tell whether a BEGIN ran on it), a watermill-sql Beginner, or a
	// *pgx.Conn outside a transaction (checked at each statement). Begin a
	// transaction and pass the pgx.Tx or *sql.Tx.
	ErrNotInTx = errors.New("outbox: not a transaction")
	// ErrMetadataTooLarge: a message's metadata exceeds
	// PublisherConfig.MaxMetadataBytes (*LimitError).
	ErrMetadataTooLarge = errors.New("outbox: metadata too large")
	// ErrPublishTooLarge: one Publish call carries more than
	// PublisherConfig.MaxPublishBytes (*LimitError).
	ErrPublishTooLarge = errors.New("outbox: one Publish call carries too many bytes")
	// ErrPoison marks a message that can never be processed (a permanent
	// error): the Subscriber takes it out of the stream instead of retrying
	// it. outbox.Reject returns an error matching it.
	ErrPoison = errors.New("outbox: poison message")
	// ErrNotKeySpecific marks a failure that is not the message's own, such
	// as a broker or database that is down (outbox.NotKeySpecific).
	ErrNotKeySpecific = errors.New("outbox: failure not specific to the message's key")
	// ErrHandlerTimeout reports a delivery whose handler did not answer
	// within SubscriberConfig.HandlerTimeout (*HandlerTimeoutError). The
	// delivery counts as a failed attempt; a late Ack or Nack of it changes
	// nothing.
	ErrHandlerTimeout = errors.New("outbox: handler timed out")
	// ErrPayloadMissing reports a message whose payload, kept in the
	// bodies table, is gone (*PayloadMissingError): each delivery of it
	// counts as a failed attempt, and after MaxAttempts it is
	// dead-lettered, never delivered with an empty payload.
	ErrPayloadMissing = errors.New("outbox: the message's payload is missing")
	// ErrTxMisuse reports a Transactional handler that left the
	// Subscriber's transaction unusable, or tried to end it
	// (*TxMisuseError). The delivery counts as a failed attempt and its
	// writes are undone.
	ErrTxMisuse = errors.New("outbox: the handler misused the subscriber's transaction")
	// ErrNotFound: what an operation names does not exist (a dead letter,
	// a consumer group's cursor): admin's and deadletter's calls return it.
	ErrNotFound = errors.New("outbox: not found")
	// ErrInvalidArgument: an argument of a call is impossible (an unknown
	// status, a negative duration, a partition out of range, a nil handler,
	// a zero value of a type that must be created by its constructor), in
	// every package.
	ErrInvalidArgument = errors.New("outbox: invalid argument")
	// ErrAlreadyRunning: Run was called on a component (Sequencer,
	// Forwarder, retention Vacuum) that is already running.
	ErrAlreadyRunning = errors.New("outbox: already running")
	// ErrWALLevel: the log-based mode (outbox.ModeWAL, package relay) needs
	// wal_level = logical.
	ErrWALLevel = errors.New("outbox: the log-based mode (ModeWAL) needs wal_level = logical; set it in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")
	// ErrNoSlot: the schema's replication slot does not exist.
	ErrNoSlot = errors.New("outbox: the schema's replication slot does not exist; create it with relay.CreateSlot (or: outbox wal create-slot)")
)

// LimitError reports a message or a Publish call over one of the
// Publisher's size limits; it matches the sentinel of the limit
// (ErrMetadataTooLarge, ErrPublishTooLarge).
type LimitError struct {
	Limit string // the PublisherConfig field: MaxMetadataBytes or MaxPublishBytes
	UUID  string // the message, "" for a whole call
	Size  int    // bytes found (for a call: counted up to the first message over the limit)
	Max   int    // the limit
}

// kind is the sentinel of e's limit.
func (e *LimitError) kind() error {
	if e.Limit == "MaxMetadataBytes" {
		return ErrMetadataTooLarge
	}
	return ErrPublishTooLarge
}

// Error says what is over which limit, and what to do.
func (e *LimitError) Error() string {
	what, todo := "this Publish call carries", "split the messages over several Publish calls (in the same transaction, they commit together), or raise the limit"
	if e.UUID != "" {
		what, todo = "message "+e.UUID+" carries", "put large values in the payload, or raise the limit"
	}
	return fmt.Sprintf("%v: %s %d bytes, over PublisherConfig.%s (%d); nothing was written: %s", e.kind(), what, e.Size, e.Limit, e.Max, todo)
}

// Is makes errors.Is match the limit's sentinel: ErrMetadataTooLarge for
// MaxMetadataBytes, ErrPublishTooLarge for MaxPublishBytes.
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

// Error says what is wrong.
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

// Error says what is wrong.
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

// Error says what is wrong.
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

// Error says what is wrong.
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

// Error says what is wrong.
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

// Error says what is wrong.
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

// Error says what is wrong.
func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox: message %s: %s", e.UUID, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidMessage) true.
func (e *MessageError) Is(target error) bool { return target == ErrInvalidMessage }

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

// Is makes errors.Is(err, ErrHandlerTimeout) true.
func (e *HandlerTimeoutError) Is(target error) bool { return target == ErrHandlerTimeout }

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

// Is makes errors.Is(err, ErrTxMisuse) true.
func (e *TxMisuseError) Is(target error) bool { return target == ErrTxMisuse }

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

// Is makes errors.Is(err, ErrPayloadMissing) true.
func (e *PayloadMissingError) Is(target error) bool { return target == ErrPayloadMissing }
