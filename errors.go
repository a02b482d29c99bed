package outbox

import "github.com/millrace/watermill-outbox/internal/errs"

// Errors returned by the outbox. Each can be matched with errors.Is; the
// structured ones can also be taken apart with errors.As.
var (
	// ErrInvalidName: a schema, topic or consumer group name is not allowed
	// (*NameError).
	ErrInvalidName = errs.ErrInvalidName
	// ErrInvalidConfig: a configuration value is impossible (*ConfigError).
	ErrInvalidConfig = errs.ErrInvalidConfig
	// ErrSchemaTooNew: the database was migrated by a newer release
	// (*SchemaVersionError).
	ErrSchemaTooNew = errs.ErrSchemaTooNew
	// ErrPartitionMismatch: a topic exists with another partition count
	// (*PartitionMismatchError).
	ErrPartitionMismatch = errs.ErrPartitionMismatch
	// ErrInvalidPartitionCount: a partition count outside 1..1024.
	ErrInvalidPartitionCount = errs.ErrInvalidPartitionCount
	// ErrPayloadTooLarge: a payload exceeds PublisherConfig.MaxPayloadBytes
	// (*PayloadTooLargeError).
	ErrPayloadTooLarge = errs.ErrPayloadTooLarge
	// ErrInvalidMessage: a message is nil, or cannot be stored byte-exact,
	// e.g. metadata with a NUL byte or invalid UTF-8 (*MessageError).
	ErrInvalidMessage = errs.ErrInvalidMessage
	// ErrPublisherClosed: Publish was called after Close.
	ErrPublisherClosed = errs.ErrPublisherClosed
	// ErrNilTx: a nil transaction was given.
	ErrNilTx = errs.ErrNilTx
	// ErrNoTx: a message context carries no transaction (see WithTx) and the
	// publisher is not allowed to open its own.
	ErrNoTx = errs.ErrNoTx
	// ErrUnsupportedTx: the transaction or database handle is of a type the
	// outbox cannot use.
	ErrUnsupportedTx = errs.ErrUnsupportedTx
	// ErrMixedTx: the messages of one Publish call carry different
	// transactions in their contexts.
	ErrMixedTx = errs.ErrMixedTx
	// ErrUnknownTopic: the topic is not registered and the publisher cannot
	// register it (no DB, or AutoCreateTopics off).
	ErrUnknownTopic = errs.ErrUnknownTopic
	// ErrClosed: a component was used after Close.
	ErrClosed = errs.ErrClosed
	// ErrNotMigrated: the schema holds no outbox tables; run Migrate first
	// (*NotMigratedError).
	ErrNotMigrated = errs.ErrNotMigrated
	// ErrNotInTx: a handle given as the caller's transaction (WithTx,
	// NewTxPublisher) is not one, so a message written through it would
	// survive the caller's rollback (*NotInTxError): a *pgxpool.Pool or
	// *pgxpool.Conn, a *sql.DB, a *sql.Conn (always: database/sql cannot
	// tell whether a BEGIN ran on it), a watermill-sql Beginner, or a
	// *pgx.Conn outside a transaction (checked at each statement). Begin a
	// transaction and pass the pgx.Tx or *sql.Tx.
	ErrNotInTx = errs.ErrNotInTx
	// ErrMetadataTooLarge: a message's metadata exceeds
	// PublisherConfig.MaxMetadataBytes (*LimitError).
	ErrMetadataTooLarge = errs.ErrMetadataTooLarge
	// ErrPublishTooLarge: one Publish call carries more than
	// PublisherConfig.MaxPublishBytes (*LimitError).
	ErrPublishTooLarge = errs.ErrPublishTooLarge
	// ErrPoison marks a message that can never be processed (a permanent
	// error): the Subscriber takes it out of the stream instead of retrying
	// it. Reject returns an error matching it.
	ErrPoison = errs.ErrPoison
	// ErrNotKeySpecific marks a failure that is not the message's own, such
	// as a broker or database that is down (see NotKeySpecific).
	ErrNotKeySpecific = errs.ErrNotKeySpecific
	// ErrHandlerTimeout reports a delivery whose handler did not answer
	// within SubscriberConfig.HandlerTimeout (*HandlerTimeoutError). The
	// delivery counts as a failed attempt; a late Ack or Nack of it changes
	// nothing.
	ErrHandlerTimeout = errs.ErrHandlerTimeout
	// ErrPayloadMissing reports a message whose payload, kept in the
	// bodies table, is gone (*PayloadMissingError): each delivery of it
	// counts as a failed attempt, and after MaxAttempts it is
	// dead-lettered, never delivered with an empty payload.
	ErrPayloadMissing = errs.ErrPayloadMissing
	// ErrTxMisuse reports a Transactional handler that left the
	// Subscriber's transaction unusable, or tried to end it
	// (*TxMisuseError). The delivery counts as a failed attempt and its
	// writes are undone.
	ErrTxMisuse = errs.ErrTxMisuse
	// ErrNotFound: what an operation names does not exist (a dead letter,
	// a consumer group's cursor). admin.ErrNotFound and
	// deadletter.ErrNotFound are this error.
	ErrNotFound = errs.ErrNotFound
	// ErrInvalidArgument: an argument of a call is impossible (an unknown
	// status, a negative duration, a partition out of range, a nil handler,
	// a zero value of a type that must be created by its constructor).
	// admin.ErrInvalidArgument and deadletter.ErrInvalidArgument are this
	// error.
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrAlreadyRunning: Run was called on a component (Sequencer,
	// Forwarder, retention Vacuum) that is already running.
	ErrAlreadyRunning = errs.ErrAlreadyRunning
)

// Structured errors; see the errs package for their fields.
type (
	// NameError reports an invalid schema, topic or consumer group name.
	NameError = errs.NameError
	// ConfigError reports an impossible configuration value.
	ConfigError = errs.ConfigError
	// SchemaVersionError reports a database migrated by a newer release.
	SchemaVersionError = errs.SchemaVersionError
	// PartitionMismatchError reports a partition count that differs from the
	// registered one.
	PartitionMismatchError = errs.PartitionMismatchError
	// PayloadTooLargeError reports an oversize payload.
	PayloadTooLargeError = errs.PayloadTooLargeError
	// MessageError reports a message that cannot be stored byte-exact.
	MessageError = errs.MessageError
	// NotMigratedError reports a schema Migrate was never run on.
	NotMigratedError = errs.NotMigratedError
	// NotInTxError reports a handle that is not an open transaction.
	NotInTxError = errs.NotInTxError
	// LimitError reports a message or Publish call over a size limit.
	LimitError = errs.LimitError
	// HandlerTimeoutError is the failure recorded for a delivery whose
	// handler did not answer in time.
	HandlerTimeoutError = errs.HandlerTimeoutError
	// TxMisuseError says what a Transactional handler did to the
	// Subscriber's transaction, and what to do instead.
	TxMisuseError = errs.TxMisuseError
	// PayloadMissingError names a message whose payload is missing.
	PayloadMissingError = errs.PayloadMissingError
)
