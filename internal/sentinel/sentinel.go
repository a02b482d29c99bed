// Package sentinel holds the error values of watermill-outbox, in one
// place every package can import (package outbox exports each under its
// own name: outbox.ErrInvalidConfig is sentinel.ErrInvalidConfig). It is
// not part of the API: match the outbox.Err values.
package sentinel

import "errors"

// Errors returned by watermill-outbox, exported by package outbox under
// the same names.
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
	// ErrTxAborted reports a Publish into a transaction that an earlier
	// statement of the caller's made fail (PostgreSQL's 25P02): nothing
	// can be written in it any more.
	ErrTxAborted = errors.New("outbox: the transaction is aborted by an earlier failed statement: roll it back, then publish in a new one")
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
