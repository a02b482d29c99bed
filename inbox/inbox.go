// Package inbox gives consumers of outbox messages exactly-once effects in
// their own PostgreSQL database: a handler's writes commit in one
// transaction with a high-water mark per (consumer, source database,
// source topic, source partition), and a message at or below the mark is
// dropped as a duplicate. The source database is the message's
// outbox.MetadataSource, set by forwarders of several databases
// (pipeline.Fleet): their messages are numbered alike. It works for messages from the outbox Subscriber, from Kafka
// (watermill-kafka) and from NATS (watermill-nats) alike, because every
// outbox message carries its position: MetadataTopic, MetadataPartition,
// MetadataSeq and MetadataIncarnation, gap-free and ordered per partition.
//
// State is one row per source partition (not one per message id), so it
// needs no cleanup job. Messages of one source partition must reach a
// consumer in seq order, as Kafka delivers a partition and the Subscriber
// delivers its partitions: a message that arrives after a later one of its
// partition took effect counts as a duplicate. A delivery costs three
// statements in the handler's transaction (the mark is locked, so
// concurrent redeliveries of one partition wait for each other). Gaps in seq are normal (dead-lettered or filtered
// messages) and never waited for. A message of an older incarnation of its
// topic (registered again since) is refused with *StaleError; a message
// without the outbox position is refused with ErrNoPosition, or passed
// through with Config.WithoutPosition = PassThrough.
//
// As Watermill middleware (one line on a Router or a handler):
//
//	in, _ := inbox.New(inbox.Config{Pool: pool, Consumer: "billing"})
//	router.AddMiddleware(in.Middleware)
//	// the handler finds the transaction with outbox.TxFromContext[pgx.Tx](msg.Context())
//
// Or in code of your own, in your transaction:
//
//	took, err := in.Process(ctx, tx, msg, func(ctx context.Context, tx pgx.Tx) error { ... })
package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// DefaultSchema is where the inbox table lives unless configured.
const DefaultSchema = "watermill_inbox"

// ErrNoPosition reports a message that carries no outbox position (topic, partition,
// seq), so the inbox cannot tell whether it is a duplicate.
var ErrNoPosition = errors.New("inbox: the message carries no outbox position (outbox_topic, outbox_partition, outbox_seq)")

// ErrStale reports a message that belongs to an older incarnation of its topic than
// one this consumer already processed (*StaleError).
var ErrStale = errors.New("inbox: message of an older incarnation of its topic")

// StaleError says which incarnations met.
type StaleError struct {
	Topic                 string
	Partition             int
	Incarnation, Recorded int64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("inbox: %s/%d: the message is of incarnation %d of the topic, older than %d, already processed: "+
		"it comes from a replay of a topic that was registered again since; drop it or reset the mark", e.Topic, e.Partition, e.Incarnation, e.Recorded)
}

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Policy says what to do with a message without the outbox position.
type Policy int

const (
	// Refuse returns ErrNoPosition (the default).
	Refuse Policy = iota
	// PassThrough runs the handler without deduplication.
	PassThrough
)

// Config configures an Inbox.
type Config struct {
	// Pool is the consumer's database. Required for Middleware; Process
	// runs in the transaction it is given.
	Pool *pgxpool.Pool
	// Schema holds the inbox table (DefaultSchema when empty); Migrate
	// creates it.
	Schema string
	// Consumer names this consumer: marks are per consumer, so two
	// consumers of one topic each get every message once. Required.
	Consumer string
	// WithoutPosition: Refuse (default) or PassThrough.
	WithoutPosition Policy
}

// Inbox deduplicates by the outbox position.
type Inbox struct {
	cfg        Config
	q          *dbsql.Queries
	duplicates atomic.Int64
	processed  atomic.Int64
}

// New creates an Inbox.
func New(cfg Config) (*Inbox, error) {
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if err := names.Schema(cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.Consumer == "" {
		return nil, &outboxtype.ConfigError{Field: "Consumer", Reason: "required: it names this consumer's marks"}
	}
	return &Inbox{cfg: cfg, q: dbsql.For(cfg.Schema)}, nil
}

// Migrate creates the inbox schema and table in db if missing. A nil db is
// outbox.ErrUnsupportedTx, as for outbox.Migrate.
func Migrate(ctx context.Context, db *pgxpool.Pool, schema string) error {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
		return err
	}
	if _, err := pgexec.FromDB(db); err != nil {
		return err
	}
	q := dbsql.For(schema)
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "watermill_outbox.inbox."+schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q.CatalogCreateSchema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q.InboxCreateTable); err != nil {
			return err
		}
		// A table of a release before sources: its marks get source ''.
		var hasSource bool
		if err := tx.QueryRow(ctx, q.InboxHasSource).Scan(&hasSource); err != nil || hasSource {
			return err
		}
		_, err := tx.Exec(ctx, q.InboxAddSource)
		return err
	})
}

// Stats counts what the inbox did.
type Stats struct {
	// Processed messages took effect; Duplicates were dropped.
	Processed, Duplicates int64
}

// Stats returns the running totals.
func (in *Inbox) Stats() Stats {
	return Stats{Processed: in.processed.Load(), Duplicates: in.duplicates.Load()}
}

// position is a message's place in the outbox: in a source (its
// database, outbox.MetadataSource; ” from a forwarder without one), a
// topic's partition, a seq.
type position struct {
	source      string
	topic       string
	partition   int
	seq         int64
	incarnation int64
}

func positionOf(msg *message.Message) (position, bool) {
	var p position
	var err error
	p.topic = msg.Metadata.Get(outbox.MetadataTopic)
	if p.topic == "" {
		return p, false
	}
	p.source = msg.Metadata.Get(outbox.MetadataSource)
	if p.partition, err = strconv.Atoi(msg.Metadata.Get(outbox.MetadataPartition)); err != nil {
		return p, false
	}
	if p.seq, err = strconv.ParseInt(msg.Metadata.Get(outbox.MetadataSeq), 10, 64); err != nil || p.seq < 1 {
		return p, false
	}
	if inc := msg.Metadata.Get(outbox.MetadataIncarnation); inc != "" {
		if p.incarnation, err = strconv.ParseInt(inc, 10, 64); err != nil {
			return p, false
		}
	}
	return p, true
}

// Process runs fn in tx unless msg is a duplicate for this consumer, and
// records its position in the same transaction, so that the effects and
// the mark commit together. It returns whether fn ran. The caller commits
// tx (or rolls it back on error: then nothing is recorded).
//
// A nil tx is outbox.ErrNilTx, a nil msg outbox.ErrInvalidMessage, a nil fn
// or an Inbox not made by New outbox.ErrInvalidArgument; a schema that
// Migrate never ran on is outbox.ErrNotMigrated.
func (in *Inbox) Process(ctx context.Context, tx pgx.Tx, msg *message.Message, fn func(ctx context.Context, tx pgx.Tx) error) (bool, error) {
	if err := in.check(); err != nil {
		return false, err
	}
	if tx == nil {
		return false, outbox.ErrNilTx
	}
	if msg == nil {
		return false, &outboxtype.MessageError{UUID: "(nil)", Reason: "inbox.Process was given a nil message"}
	}
	if fn == nil {
		return false, errs.NilArgument("inbox.Process: fn", "pass the function that applies the message's effects in tx")
	}
	p, ok := positionOf(msg)
	if !ok {
		if in.cfg.WithoutPosition == PassThrough {
			return true, fn(ctx, tx)
		}
		return false, fmt.Errorf("%w: message %s", ErrNoPosition, msg.UUID)
	}
	c := in.cfg.Consumer
	if _, err := tx.Exec(ctx, in.q.InboxEnsure, c, p.topic, p.partition, p.source); err != nil {
		return false, in.schemaErr(err)
	}
	var incarnation, seq int64
	if err := tx.QueryRow(ctx, in.q.InboxLock, c, p.topic, p.partition, p.source).Scan(&incarnation, &seq); err != nil {
		return false, in.schemaErr(err)
	}
	switch {
	case p.incarnation < incarnation:
		return false, &StaleError{Topic: p.topic, Partition: p.partition, Incarnation: p.incarnation, Recorded: incarnation}
	case p.incarnation == incarnation && p.seq <= seq:
		in.duplicates.Add(1)
		return false, nil
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, in.q.InboxAdvance, c, p.topic, p.partition, p.incarnation, p.seq, p.source); err != nil {
		return false, in.schemaErr(err)
	}
	in.processed.Add(1)
	return true, nil
}

// check refuses an Inbox that New did not make.
func (in *Inbox) check() error {
	if in == nil || in.q == nil {
		return errs.NotConstructed("inbox.Inbox", "inbox.New")
	}
	return nil
}

// schemaErr reports a database error of the inbox's statements: a missing
// table or schema as a *NotMigratedError (outbox.ErrNotMigrated) that names
// inbox.Migrate.
func (in *Inbox) schemaErr(err error) error {
	if schemacheck.IsUndefined(err) {
		return &outboxtype.NotMigratedError{Schema: in.cfg.Schema, Cause: err, Run: fmt.Sprintf("inbox.Migrate(ctx, pool, %q)", in.cfg.Schema)}
	}
	return fmt.Errorf("inbox: %w", err)
}

// Middleware is Watermill handler middleware: it runs the handler in a
// transaction of its own on Config.Pool (the handler gets it with
// outbox.TxFromContext[pgx.Tx](msg.Context())), with the mark, and acks a
// duplicate without running the handler. Messages the handler returns are
// passed on as usual (publish them with an outbox Publisher in the same
// transaction for exactly-once forwarding).
func (in *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if err := in.check(); err != nil {
			return nil, err
		}
		if h == nil {
			return nil, errs.NilArgument("inbox.Inbox.Middleware: the handler", "pass the handler to wrap")
		}
		if msg == nil {
			return nil, &outboxtype.MessageError{UUID: "(nil)", Reason: "the handler inbox.Inbox.Middleware wraps was given a nil message"}
		}
		if in.cfg.Pool == nil {
			return nil, &outboxtype.ConfigError{Field: "Pool", Reason: "Middleware needs the consumer's database pool"}
		}
		ctx := msg.Context()
		var produced []*message.Message
		err := pgx.BeginFunc(ctx, in.cfg.Pool, func(tx pgx.Tx) error {
			_, err := in.Process(ctx, tx, msg, func(ctx context.Context, tx pgx.Tx) error {
				orig := msg.Context()
				msg.SetContext(outbox.WithTx(orig, tx))
				defer msg.SetContext(orig)
				var herr error
				produced, herr = h(msg)
				return herr
			})
			return err
		})
		if err != nil {
			return nil, err
		}
		return produced, nil
	}
}
