package deadletter

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
)

// DefaultMaxReasonBytes is the default of Config.MaxReasonBytes.
const DefaultMaxReasonBytes = consumer.DefaultMaxReasonBytes

// Config configures a Store.
type Config struct {
	// Schema is the outbox schema (outbox.DefaultSchema when empty),
	// migrated with outbox.Migrate.
	Schema string
	// Pool is the connection pool for the store's own operations (List,
	// Replay, ...; HandleReject runs in the caller's transaction). Required.
	Pool *pgxpool.Pool
	// Partitioner maps a replayed message's partition key to its partition
	// (default: the outbox's Kafka-compatible murmur2). Set it to the one
	// the original publisher used.
	Partitioner partitioning.Partitioner
	// MaxReasonBytes bounds the stored reason text (default
	// DefaultMaxReasonBytes); longer reasons are cut.
	MaxReasonBytes int
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = outbox.DefaultSchema
	}
	if c.Partitioner == nil {
		c.Partitioner = partitioning.Default()
	}
	if c.MaxReasonBytes == 0 {
		c.MaxReasonBytes = DefaultMaxReasonBytes
	}
}

// Validate reports the first impossible setting as a *outboxtype.ConfigError,
// or a *outboxtype.NameError for a bad schema name.
func (c Config) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	switch {
	case c.Pool == nil:
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	case c.MaxReasonBytes < 16:
		return &outboxtype.ConfigError{Field: "MaxReasonBytes", Reason: fmt.Sprintf("must be at least 16, got %d", c.MaxReasonBytes)}
	}
	return nil
}

// Status is the state of a dead-letter entry.
type Status string

// The statuses of an entry. Every entry starts pending; Replay and Discard
// end that state, once.
const (
	StatusPending   Status = "pending"
	StatusReplayed  Status = "replayed"
	StatusDiscarded Status = "discarded"
)

func (s Status) valid() bool {
	return s == StatusPending || s == StatusReplayed || s == StatusDiscarded
}

// Entry is one dead letter.
type Entry struct {
	// ID identifies the entry in the store.
	ID int64 `json:"id"`
	// Group is the consumer group that rejected the message (for a message
	// that did not come from an outbox Subscriber: the handler name the
	// PoisonQueue middleware recorded, if any).
	Group string `json:"group"`
	// Topic is the topic the message was read from.
	Topic string `json:"topic"`
	// Partition and Seq are the message's position in the outbox log;
	// -1 and 0 when External.
	Partition int   `json:"partition"`
	Seq       int64 `json:"seq"`
	// External is true for a message that did not come from the outbox log
	// (written through PoisonPublisher from another subscriber).
	External bool `json:"external"`
	// UUID, PartitionKey, Metadata and Payload are the message as the
	// handler last saw it (with the metadata the Subscriber and middleware
	// added).
	UUID         string            `json:"uuid"`
	PartitionKey string            `json:"partition_key,omitempty"`
	Metadata     map[string]string `json:"metadata"`
	Payload      []byte            `json:"payload"`
	// Reason is why the message was taken out of its stream.
	Reason string `json:"reason"`
	// Attempts is how many times the message was delivered: every
	// hand-out to a handler, a delivery a crash of the consumer process
	// cut short included. MaxAttempts counts failures (a nack, an error,
	// a timeout, a crash the message caused alone); a delivery a crash
	// cut short while other deliveries were in flight in the process is
	// nobody's failure, so Attempts can exceed MaxAttempts, and the
	// reason then says by how many (docs/failure-modes.md §3).
	Attempts int `json:"attempts"`
	// FirstFailureAt and LastFailureAt bound the failures seen.
	FirstFailureAt time.Time `json:"first_failure_at"`
	LastFailureAt  time.Time `json:"last_failure_at"`
	// Status is pending until the entry is replayed or discarded.
	Status Status `json:"status"`
	// ReplayTopic and ReplayUUID name the message Replay published.
	ReplayTopic string `json:"replay_topic,omitempty"`
	ReplayUUID  string `json:"replay_uuid,omitempty"`
	// CreatedAt is when the entry was written, UpdatedAt when its status
	// last changed.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Store is the dead-letter store. It implements outboxtype.RejectHandler and is
// safe for concurrent use.
type Store struct {
	cfg    Config
	logger watermill.LoggerAdapter
	q      *dbsql.Queries // the statements, for cfg.Schema
	db     pgexec.DB      // cfg.Pool adapted, for the schema check
}

var _ outboxtype.RejectHandler = (*Store)(nil)

// NewStore creates a Store over the dead_letters table of cfg.Schema. It
// does not touch the database: the first use of each operation checks the
// schema, and a schema that was never migrated gives an error matching
// outbox.ErrNotMigrated, one migrated by a newer release
// outbox.ErrSchemaTooNew (one query per pool and schema, then cached).
func NewStore(cfg Config, logger watermill.LoggerAdapter) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	db, err := pgexec.FromDB(cfg.Pool)
	if err != nil {
		return nil, err
	}
	return &Store{
		cfg:    cfg,
		logger: logger.With(watermill.LogFields{"component": "outbox.deadletter", "schema": cfg.Schema}),
		q:      dbsql.For(cfg.Schema),
		db:     db,
	}, nil
}

// HandleReject stores m in tx, the transaction that moves the group's cursor
// past it (outboxtype.RejectHandler). Writing the same message (group, topic,
// partition, seq) again is a no-op, so a retried rejection never
// duplicates an entry. A message with Seq 0 is stored as External and
// deduplicated by (group, topic, uuid).
func (s *Store) HandleReject(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
	if tx == nil {
		return outbox.ErrNilTx
	}
	if s.q == nil {
		return errs.NotConstructed("deadletter.Store", "deadletter.NewStore")
	}
	// The check reads the version in tx itself (a query that cannot fail on
	// a missing table, so it never aborts tx) rather than on another
	// connection of the pool, which a busy pool might not have.
	q, err := pgexec.FromTx(tx)
	if err != nil {
		return err
	}
	if err := schemacheck.Check(ctx, s.cfg.Pool, q, s.cfg.Schema); err != nil {
		return err
	}
	_, err = s.insert(ctx, tx, m)
	return err
}

// Add stores m in a transaction of its own and reports whether it was new
// (false: an entry for the same message exists). It is for messages that
// are not rejected by a Subscriber, e.g. from another message broker.
func (s *Store) Add(ctx context.Context, m outboxtype.RejectedMessage) (bool, error) {
	if err := s.check(ctx); err != nil {
		return false, err
	}
	return s.insert(ctx, s.cfg.Pool, m)
}

// check refuses a schema that was never migrated (outbox.ErrNotMigrated)
// or was migrated by a newer release (outbox.ErrSchemaTooNew); one query
// per pool and schema.
func (s *Store) check(ctx context.Context) error {
	if s.q == nil {
		return errs.NotConstructed("deadletter.Store", "deadletter.NewStore")
	}
	return schemacheck.Check(ctx, s.cfg.Pool, s.db, s.cfg.Schema)
}

// wrap turns the "does not exist" error of a schema dropped after the check
// into an error matching outbox.ErrNotMigrated.
func (s *Store) wrap(err error) error { return schemacheck.Wrap(err, s.cfg.Schema) }

// querier is what pgx.Tx and *pgxpool.Pool have in common.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) insert(ctx context.Context, q querier, m outboxtype.RejectedMessage) (bool, error) {
	// The group is checked as a Subscriber checks its ConsumerGroup, so
	// that no entry shows a name a terminal would act on; the error
	// matches outbox.ErrInvalidName.
	if err := names.Group(m.Group); err != nil {
		return false, fmt.Errorf("deadletter: store message %s: %w", m.UUID, err)
	}
	inserted, err := consumer.InsertDeadLetter(ctx, q, s.q, m, s.cfg.MaxReasonBytes)
	return inserted, s.wrap(err)
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}
