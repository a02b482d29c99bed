package outbox

import "github.com/millrace/watermill-outbox/internal/sentinel"

// Errors returned by watermill-outbox, by this package and every other
// (one value each, under one name: match outbox.ErrX whichever package
// returned it). Each can be matched with errors.Is; the structured ones,
// the outboxtype error types named below, can also be taken apart with
// errors.As.
var (
	// ErrInvalidName: a schema, topic or consumer group name is not allowed
	// (*outboxtype.NameError).
	ErrInvalidName = sentinel.ErrInvalidName
	// ErrInvalidConfig: a configuration value is impossible (*outboxtype.ConfigError).
	ErrInvalidConfig = sentinel.ErrInvalidConfig
	// ErrSchemaTooNew: the database was migrated by a newer release
	// (*outboxtype.SchemaVersionError).
	ErrSchemaTooNew = sentinel.ErrSchemaTooNew
	// ErrPartitionMismatch: a topic exists with another partition count
	// (*outboxtype.PartitionMismatchError).
	ErrPartitionMismatch = sentinel.ErrPartitionMismatch
	// ErrInvalidPartitionCount: a partition count outside 1..1024.
	ErrInvalidPartitionCount = sentinel.ErrInvalidPartitionCount
	// ErrPayloadTooLarge: a payload exceeds PublisherConfig.MaxPayloadBytes
	// (*outboxtype.PayloadTooLargeError).
	ErrPayloadTooLarge = sentinel.ErrPayloadTooLarge
	// ErrInvalidMessage: a message is nil, or cannot be stored byte-exact,
	// e.g. metadata with a NUL byte or invalid UTF-8 (*outboxtype.MessageError).
	ErrInvalidMessage = sentinel.ErrInvalidMessage
	// ErrPublisherClosed: Publish was called after Close.
	ErrPublisherClosed = sentinel.ErrPublisherClosed
	// ErrNilTx: a nil transaction was given.
	ErrNilTx = sentinel.ErrNilTx
	// ErrNoTx: a message context carries no transaction (see WithTx) and the
	// publisher is not allowed to open its own.
	ErrNoTx = sentinel.ErrNoTx
	// ErrUnsupportedTx: the transaction or database handle is of a type the
	// outbox cannot use.
	ErrUnsupportedTx = sentinel.ErrUnsupportedTx
	// ErrMixedTx: the messages of one Publish call carry different
	// transactions in their contexts.
	ErrMixedTx = sentinel.ErrMixedTx
	// ErrUnknownTopic: the topic is not registered; register it with
	// outbox.RegisterTopic (or: outbox topics register) before use.
	ErrUnknownTopic = sentinel.ErrUnknownTopic
	// ErrForwardOnly: a Subscriber was asked to read a topic registered
	// with ForwardOnly, whose messages only its Forwarder reads.
	ErrForwardOnly = sentinel.ErrForwardOnly
	// ErrClosed: a component was used after Close.
	ErrClosed = sentinel.ErrClosed
	// ErrNotMigrated: the schema holds no outbox tables; run Migrate first
	// (*outboxtype.NotMigratedError).
	ErrNotMigrated = sentinel.ErrNotMigrated
	// ErrNotInTx: a handle given as the caller's transaction (WithTx,
	// NewTxPublisher) is not one, so a message written through it would
	// survive the caller's rollback (*outboxtype.NotInTxError): a *pgxpool.Pool or
	// *pgxpool.Conn, a *sql.DB, a *sql.Conn (always: database/sql cannot
	// tell whether a BEGIN ran on it), a watermill-sql Beginner, or a
	// *pgx.Conn outside a transaction (checked at each statement). Begin a
	// transaction and pass the pgx.Tx or *sql.Tx.
	ErrNotInTx = sentinel.ErrNotInTx
	// ErrMetadataTooLarge: a message's metadata exceeds
	// PublisherConfig.MaxMetadataBytes (*outboxtype.LimitError).
	ErrMetadataTooLarge = sentinel.ErrMetadataTooLarge
	// ErrPublishTooLarge: one Publish call carries more than
	// PublisherConfig.MaxPublishBytes (*outboxtype.LimitError).
	ErrPublishTooLarge = sentinel.ErrPublishTooLarge
	// ErrPoison marks a message that can never be processed (a permanent
	// error): the Subscriber takes it out of the stream instead of retrying
	// it. Reject returns an error matching it.
	ErrPoison = sentinel.ErrPoison
	// ErrNotKeySpecific marks a failure that is not the message's own, such
	// as a broker or database that is down (see NotKeySpecific).
	ErrNotKeySpecific = sentinel.ErrNotKeySpecific
	// ErrHandlerTimeout reports a delivery whose handler did not answer
	// within SubscriberConfig.HandlerTimeout (*outboxtype.HandlerTimeoutError). The
	// delivery counts as a failed attempt; a late Ack or Nack of it changes
	// nothing.
	ErrHandlerTimeout = sentinel.ErrHandlerTimeout
	// ErrPayloadMissing reports a message whose payload, kept in the
	// bodies table, is gone (*outboxtype.PayloadMissingError): each delivery of it
	// counts as a failed attempt, and after MaxAttempts it is
	// dead-lettered, never delivered with an empty payload.
	ErrPayloadMissing = sentinel.ErrPayloadMissing
	// ErrTxMisuse reports a Transactional handler that left the
	// Subscriber's transaction unusable, or tried to end it
	// (*outboxtype.TxMisuseError). The delivery counts as a failed attempt and its
	// writes are undone.
	ErrTxMisuse = sentinel.ErrTxMisuse
	// ErrTxAborted reports a Publish into a transaction that an earlier
	// statement of the caller's made fail (PostgreSQL's SQLSTATE 25P02):
	// nothing can be written in it any more, nothing of the call was. Roll
	// the transaction back and publish in a new one.
	ErrTxAborted = sentinel.ErrTxAborted
	// ErrNotFound: what an operation names does not exist (a dead letter,
	// a consumer group's cursor): admin's and deadletter's calls return it.
	ErrNotFound = sentinel.ErrNotFound
	// ErrInvalidArgument: an argument of a call is impossible (an unknown
	// status, a negative duration, a partition out of range, a nil handler,
	// a zero value of a type that must be created by its constructor), in
	// every package.
	ErrInvalidArgument = sentinel.ErrInvalidArgument
	// ErrAlreadyRunning: Run was called on a component (Sequencer,
	// Forwarder, retention Vacuum) that is already running.
	ErrAlreadyRunning = sentinel.ErrAlreadyRunning
)
