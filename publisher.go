package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/walrecord"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
)

// PublishPartitionKeyMetadata is the metadata key a Publisher reads a
// message's partition key from ("partition_key"), unless
// PublisherConfig.PartitionKeyFunc says otherwise: set it before Publish.
// It is not MetadataPartitionKey, the key under which the Subscriber
// delivers a message's partition key, however it was given.
const PublishPartitionKeyMetadata = "partition_key"

// Size limits, checked before anything is sent.
const (
	DefaultMaxPayloadBytes = 1 << 20   // 1 MiB, Kafka's default message size limit
	MaxMaxPayloadBytes     = 256 << 20 // what one Publish may carry per message
	// DefaultMaxMetadataBytes bounds one message's metadata, as stored
	// (JSON): Kafka headers and NATS headers live in the same message-size
	// budget as the payload.
	DefaultMaxMetadataBytes = 64 << 10
	// DefaultMaxPublishBytes bounds one Publish call: payloads plus
	// metadata of all its messages. One call is one statement whose array
	// parameters PostgreSQL must hold in memory at once (and a single value
	// is capped at 1 GB), so split larger batches.
	DefaultMaxPublishBytes = 64 << 20
	// MaxMaxPublishBytes is the largest MaxPublishBytes (and
	// MaxMetadataBytes) allowed: well below PostgreSQL's 1 GB value limit.
	MaxMaxPublishBytes = 512 << 20
)

// PartitionKeyFunc returns the partition key of a message. Messages with the
// same key go to the same partition and keep their order; an empty key means
// "no order needed": such messages are spread evenly over the partitions.
type PartitionKeyFunc func(topic string, msg *message.Message) (string, error)

// partitionKeyFromMetadata reads the partition key from msg's metadata
// (PublishPartitionKeyMetadata). It is the default PartitionKeyFunc.
func partitionKeyFromMetadata(_ string, msg *message.Message) (string, error) {
	if msg == nil {
		return "", &outboxtype.MessageError{UUID: "(nil)", Reason: "no partition key of a nil message"}
	}
	return msg.Metadata.Get(PublishPartitionKeyMetadata), nil
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Schema is the PostgreSQL schema of the outbox tables (DefaultSchema
	// when empty). Create it with Migrate.
	Schema string

	// DB is an optional *pgxpool.Pool or *sql.DB. With OwnTransaction the
	// publisher writes through it the messages whose context carries no
	// transaction.
	DB any

	// OwnTransaction lets a context-bound publisher write a message whose
	// context has no transaction in a transaction of its own through DB.
	// When false such a Publish fails with ErrNoTx, which is what a handler
	// that must publish atomically with its own writes wants.
	OwnTransaction bool

	// PartitionKeyFunc extracts the partition key (default: metadata
	// PublishPartitionKeyMetadata, "partition_key").
	PartitionKeyFunc PartitionKeyFunc

	// Partitioner maps keys to partitions (default: Kafka-compatible
	// murmur2, see package partitioning).
	Partitioner partitioning.Partitioner

	// MaxPayloadBytes limits the size of one message's payload (default
	// DefaultMaxPayloadBytes, or MaxPublishBytes when that is set lower; at
	// most MaxMaxPayloadBytes).
	MaxPayloadBytes int

	// MaxMetadataBytes limits one message's metadata, as stored (JSON;
	// default DefaultMaxMetadataBytes, at most MaxMaxPublishBytes). A
	// message over it gets an ErrMetadataTooLarge *outboxtype.LimitError.
	MaxMetadataBytes int

	// MaxPublishBytes limits what one Publish call carries, payloads and
	// metadata of all its messages (default DefaultMaxPublishBytes, or
	// MaxPayloadBytes when that is set higher; at most
	// MaxMaxPublishBytes). A call over it gets an ErrPublishTooLarge
	// *outboxtype.LimitError before anything is sent.
	MaxPublishBytes int

	// DisableNotify turns off the NOTIFY that wakes the sequencer when a
	// transaction that published commits. The sequencer then finds new
	// messages by polling only.
	DisableNotify bool

	// NotifyInterval spaces the NOTIFYs (default DefaultNotifyInterval;
	// negative: one per Publish call). A Publish call sends one only if no
	// Publisher of this process sent one for the same schema within the
	// interval. PostgreSQL serializes the commits of transactions that
	// notify, holding a lock through their WAL flush, so a NOTIFY per
	// transaction caps a stream of small transactions at one commit per
	// flush. Messages of a transaction that did not notify are found by
	// the sequencer, which keeps polling for a while after each pass that
	// found work (see SequencerConfig.MinPassInterval); see
	// docs/operations.md for the one case where such a message waits up to
	// the sequencer's PollInterval.
	NotifyInterval time.Duration

	// Mode is where messages are written: ModeTable (the default) or
	// ModeWAL. See PublishMode.
	Mode PublishMode

	// DedupWindow is how long a message's dedup key (DedupKey) keeps
	// later messages of its topic with the same key from being stored,
	// from its publish on (default DefaultDedupWindow, 24 hours; at least
	// 1µs). The window is fixed when the key is claimed: a Publisher with
	// another window changes only the keys it claims afterwards.
	DedupWindow time.Duration

	// DedupWindows overrides DedupWindow per topic (each at least 1µs).
	DedupWindows map[string]time.Duration
}

// PublishMode says where a Publisher writes messages. Both modes keep the
// Publisher's contract (a message is stored if and only if the caller's
// transaction commits) and end in the same log, read by the same
// Subscribers; docs/architecture.md compares them.
type PublishMode int

const (
	// ModeTable writes each message into the pending table, where the
	// Sequencer gives it its seq. Works on any PostgreSQL.
	ModeTable PublishMode = iota
	// ModeWAL writes each message only into the WAL, with
	// pg_logical_emit_message; the relay package reads it from a logical
	// replication slot, gives it its seq and appends it to the log. It
	// needs wal_level = logical, a slot (relay.CreateSlot) and a running
	// relay.Relay: until one runs, messages wait in the WAL, which the
	// server keeps.
	//
	// A message is written only if a relay can read it: the statement that
	// writes it first checks wal_level and the schema's slot, and fails
	// with ErrWALLevel or ErrNoSlot otherwise (no slot yet, a slot dropped,
	// still being created, or invalidated), which aborts the caller's
	// transaction: its other writes cannot commit without their messages.
	ModeWAL
)

// The errors of ModeWAL, also returned by the relay package.
var (
	// ErrWALLevel: the server does not run with wal_level = logical, so no
	// slot can decode what a Publisher in ModeWAL writes; set it and
	// restart PostgreSQL.
	ErrWALLevel = sentinel.ErrWALLevel
	// ErrNoSlot: the schema's replication slot does not exist (or is still
	// being created, or was invalidated), so no relay could read what a
	// Publisher in ModeWAL writes; create it with relay.CreateSlot (outbox
	// wal create-slot).
	ErrNoSlot = sentinel.ErrNoSlot
)

// DefaultNotifyInterval is the default PublisherConfig.NotifyInterval.
const DefaultNotifyInterval = 10 * time.Millisecond

func (c *PublisherConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.PartitionKeyFunc == nil {
		c.PartitionKeyFunc = partitionKeyFromMetadata
	}
	if c.Partitioner == nil {
		c.Partitioner = partitioning.Default()
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
		if c.MaxPublishBytes > 0 {
			c.MaxPayloadBytes = min(c.MaxPayloadBytes, c.MaxPublishBytes)
		}
	}
	if c.MaxMetadataBytes == 0 {
		c.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	if c.MaxPublishBytes == 0 {
		c.MaxPublishBytes = max(DefaultMaxPublishBytes, c.MaxPayloadBytes)
	}
	if c.NotifyInterval == 0 {
		c.NotifyInterval = DefaultNotifyInterval
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
}

// Validate reports the first impossible setting as a *outboxtype.ConfigError (or a
// *outboxtype.NameError for a bad schema or topic name).
func (c PublisherConfig) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	if c.MaxPayloadBytes < 0 || c.MaxPayloadBytes > MaxMaxPayloadBytes {
		return &outboxtype.ConfigError{Field: "MaxPayloadBytes", Reason: fmt.Sprintf("%d is outside 1..%d", c.MaxPayloadBytes, MaxMaxPayloadBytes)}
	}
	if c.MaxMetadataBytes < 0 || c.MaxMetadataBytes > MaxMaxPublishBytes {
		return &outboxtype.ConfigError{Field: "MaxMetadataBytes", Reason: fmt.Sprintf("%d is outside 1..%d", c.MaxMetadataBytes, MaxMaxPublishBytes)}
	}
	if c.MaxPublishBytes < c.MaxPayloadBytes || c.MaxPublishBytes > MaxMaxPublishBytes {
		return &outboxtype.ConfigError{Field: "MaxPublishBytes", Reason: fmt.Sprintf("%d is outside MaxPayloadBytes (%d)..%d", c.MaxPublishBytes, c.MaxPayloadBytes, MaxMaxPublishBytes)}
	}
	if c.Mode != ModeTable && c.Mode != ModeWAL {
		return &outboxtype.ConfigError{Field: "Mode", Reason: fmt.Sprintf("%d is neither ModeTable nor ModeWAL", c.Mode)}
	}
	if err := validateDedupWindows(c); err != nil {
		return err
	}
	if c.OwnTransaction && c.DB == nil {
		return &outboxtype.ConfigError{Field: "OwnTransaction", Reason: "needs DB to open transactions"}
	}
	if c.DB != nil {
		if _, err := pgexec.FromDB(c.DB); err != nil {
			return &outboxtype.ConfigError{Field: "DB", Reason: err.Error()}
		}
	}
	return nil
}

// Publisher is a message.Publisher that writes messages into the outbox
// inside the caller's PostgreSQL transaction: a message is stored if and only
// if that transaction commits. The sequencer later gives it its place (seq)
// in its partition.
//
// Every Publish call is one round trip to the server however many messages
// it carries (after the first use of a topic, whose partition count is then
// cached). Messages of one call keep their order. A Publisher is safe for
// concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	logger watermill.LoggerAdapter
	bound  pgexec.Querier // the transaction of a NewTxPublisher, nil otherwise
	db     pgexec.DB      // cfg.DB adapted, may be nil

	insertSQL       string // without NOTIFY
	insertNotifySQL string // with NOTIFY; "" when DisableNotify
	// The same for a single message: plain VALUES, cheaper than unnest.
	insertOneSQL, insertOneNotifySQL string
	channel                          string
	notifyGate                       *notifyGate
	// ModeWAL: the statements, the schema's slot and the records' prefix.
	emitSQL, emitOneSQL, walSlot, walPrefix string

	mu     sync.Mutex
	topics map[string]*topicState

	schemaChecked atomic.Bool // the schema's version was checked once

	closed atomic.Bool
}

type topicState struct {
	partitions int
	next       atomic.Uint64 // round-robin position for keyless messages
}

// NewPublisher creates a context-bound Publisher: one long-lived instance,
// typically injected into handlers, that writes each message into the
// transaction stored in the message's context with WithTx.
func NewPublisher(cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	return newPublisher(nil, cfg, logger)
}

// NewTxPublisher creates a Publisher bound to one transaction tx: a pgx.Tx, a
// *sql.Tx or a watermill-sql transaction (anything with database/sql's
// ExecContext and QueryContext, plus Commit and Rollback). The database/sql
// path needs a driver that accepts Go slices as array parameters, such as
// pgx's stdlib driver.
//
// A handle that is not a transaction is refused with ErrNotInTx (see
// there): a pool, *sql.DB or *sql.Conn would commit each message on its own.
// A *pgx.Conn is accepted, and each Publish checks that a transaction is in
// progress on it.
func NewTxPublisher(tx any, cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	q, err := pgexec.FromTx(tx)
	if err != nil {
		return nil, err
	}
	return newPublisher(q, cfg, logger)
}

func newPublisher(bound pgexec.Querier, cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	p := &Publisher{
		cfg:     cfg,
		logger:  logger,
		bound:   bound,
		topics:  make(map[string]*topicState),
		channel: names.PendingChannel(cfg.Schema),
	}
	if cfg.DB != nil {
		p.db, _ = pgexec.FromDB(cfg.DB) // checked by Validate
	}
	q := dbsql.For(cfg.Schema)
	p.insertSQL, p.insertOneSQL = q.PendingInsert, q.PendingInsertOne
	if cfg.Mode == ModeWAL {
		p.emitSQL, p.emitOneSQL = q.WALEmit, q.WALEmitOne
		p.walSlot, p.walPrefix = dbsql.WALName(cfg.Schema), names.WALPrefix(cfg.Schema)
	} else if !cfg.DisableNotify {
		p.insertNotifySQL, p.insertOneNotifySQL = q.PendingInsertNotify, q.PendingInsertOneNotify
		p.notifyGate = notifyGateFor(p.channel)
	}
	return p, nil
}

// Publish writes msgs to topic in the caller's transaction. See Publisher.
// A message whose dedup key (DedupKey) is taken is left out, and
// Deduplicated(msg) reports it; Publish returns nil for it.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return txAborted(p.publish(topic, msgs))
}

// txAborted marks err with ErrTxAborted when it is PostgreSQL's "current
// transaction is aborted" (25P02): the caller's transaction failed before
// this call, which is what the caller must know, not the statement that
// found it.
func txAborted(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "25P02" {
		return fmt.Errorf("%w: %w", ErrTxAborted, err)
	}
	return err
}

func (p *Publisher) publish(topic string, msgs []*message.Message) error {
	if p.closed.Load() {
		return ErrPublisherClosed
	}
	if err := names.Topic(topic); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		if m == nil {
			return &outboxtype.MessageError{UUID: "(nil)", Reason: fmt.Sprintf("message %d (0-based) of the %d given to Publish is nil; nothing was written: pass only non-nil messages", i, len(msgs))}
		}
	}
	q, ctx, err := p.executor(msgs)
	if err != nil {
		return err
	}
	if err := p.checkSchema(ctx, q); err != nil {
		return err
	}
	ts, err := p.topic(ctx, q, topic)
	if err != nil {
		return schemacheck.Wrap(err, p.cfg.Schema)
	}
	dedup, err := planDedup(msgs) // nil without dedup keys: the statements below as ever
	if err != nil {
		return err
	}
	span := observe.StartPublish(topic, msgs) // traceparent into the metadata, before it is encoded
	batch, err := p.encode(topic, ts, msgs)
	if err != nil {
		span.End(err)
		return err
	}
	stored := len(msgs)
	if dedup == nil {
		sql, args := p.statement(topic, batch)
		_, err = q.Exec(ctx, sql, args...)
	} else {
		stored, err = p.publishDedup(ctx, q, topic, msgs, batch, dedup)
	}
	if err != nil {
		if werr := p.walRefusal(err, topic, len(msgs)); werr != nil {
			err = werr
		} else {
			err = schemacheck.Wrap(fmt.Errorf("outbox: publish %d message(s) to %q: %w", len(msgs), topic, err), p.cfg.Schema)
		}
		span.End(err)
		return err
	}
	span.End(nil)
	observe.Current().Published(topic, stored, batch.bytes)
	return nil
}

// statement returns the statement that writes batch and its arguments.
func (p *Publisher) statement(topic string, batch encodedBatch) (string, []any) {
	n := len(batch.uuids)
	if p.cfg.Mode == ModeWAL {
		records := walRecords(topic, batch)
		if n == 1 {
			return p.emitOneSQL, []any{p.walSlot, p.walPrefix, records[0]}
		}
		return p.emitSQL, []any{p.walSlot, p.walPrefix, records}
	}
	sql, notifySQL := p.insertSQL, p.insertNotifySQL
	args := []any{topic, batch.partitions, batch.keys, batch.uuids, batch.metadata, batch.payloads}
	if n == 1 {
		sql, notifySQL = p.insertOneSQL, p.insertOneNotifySQL
		args = []any{topic, batch.partitions[0], batch.keys[0], batch.uuids[0], batch.metadata[0], batch.payloads[0]}
	}
	if p.notifyGate != nil && p.notifyGate.pass(time.Now(), p.cfg.NotifyInterval) {
		sql, args = notifySQL, append(args, p.channel)
	}
	return sql, args
}

// walRecords encodes batch as the log-based mode's records.
func walRecords(topic string, batch encodedBatch) [][]byte {
	records := make([][]byte, len(batch.uuids))
	for i := range records {
		records[i] = walrecord.Append(make([]byte, 0, walrecord.Size(topic, batch.keys[i], batch.uuids[i], batch.metadata[i], batch.payloads[i])),
			batch.partitions[i], topic, batch.keys[i], batch.uuids[i], batch.metadata[i], batch.payloads[i])
	}
	return records
}

// walRefusal turns the refusals of the statement that writes into the WAL
// (wal_emit, 0010_wal_emit.sql) into ErrWALLevel and ErrNoSlot, saying
// why and what to do, and a schema migrated before that function into
// ErrNotMigrated; nil for any other error.
func (p *Publisher) walRefusal(err error, topic string, n int) error {
	var pe *pgconn.PgError
	if p.cfg.Mode != ModeWAL || !errors.As(err, &pe) {
		return nil
	}
	var kind error
	var why string
	switch pe.Code {
	case "WO001":
		kind, why = ErrWALLevel, strings.TrimPrefix(pe.Message, "watermill-outbox: ")
	case "WO002":
		kind, why = ErrNoSlot, fmt.Sprintf("there is no logical slot %q (pgoutput) in this database", p.walSlot)
	case "WO003":
		kind, why = ErrNoSlot, fmt.Sprintf("slot %q is still being created, and a slot does not decode the transactions open while it is created (it waits for them to end); roll back and retry once outbox wal create-slot (relay.CreateSlot) has returned", p.walSlot)
	case "WO004":
		kind, why = ErrNoSlot, fmt.Sprintf("slot %q was invalidated (wal_status lost: it fell behind by more than max_slot_wal_keep_size) and can no longer be streamed; drop it (outbox wal drop-slot --force) and create it again", p.walSlot)
	case "42883": // undefined_function: a schema migrated by an older release
		if strings.Contains(pe.Message, "wal_emit") {
			return &outboxtype.NotMigratedError{Schema: p.cfg.Schema, Cause: err}
		}
		return nil
	default:
		return nil
	}
	return fmt.Errorf("%w (%s): none of the %d message(s) to %q was written, because no relay could ever read them, and the transaction is aborted, so that its other writes cannot commit without them", kind, why, n, topic)
}

// checkSchema refuses a schema that was never migrated (ErrNotMigrated) or
// was migrated by a newer release (ErrSchemaTooNew). A success is cached,
// so it costs one statement per Publisher at most, and less: per DB, or per
// database for pgx transactions (pgexec.Identity), across Publishers, so a
// NewTxPublisher per transaction does not pay it every time.
//
// The version is read through q, the executor of this call: the caller's
// transaction (the query cannot fail on a missing schema or table, so it
// never aborts that transaction, and it takes no second connection that a
// busy pool might not have) or DB for OwnTransaction.
func (p *Publisher) checkSchema(ctx context.Context, q pgexec.Querier) error {
	if p.schemaChecked.Load() {
		return nil
	}
	handle := p.cfg.DB
	if handle == nil {
		handle = pgexec.Identity(q) // nil: this Publisher's flag is the only cache
	}
	if err := schemacheck.Check(ctx, handle, q, p.cfg.Schema); err != nil {
		return err
	}
	p.schemaChecked.Store(true)
	return nil
}

// executor picks the transaction the messages are written in.
func (p *Publisher) executor(msgs []*message.Message) (pgexec.Querier, context.Context, error) {
	ctx := msgs[0].Context()
	if p.bound != nil {
		return p.bound, ctx, nil
	}
	first := pgexec.BindingFrom(ctx)
	for _, m := range msgs[1:] {
		if b := pgexec.BindingFrom(m.Context()); !pgexec.SameTx(b, first) {
			return nil, nil, ErrMixedTx
		}
	}
	switch {
	case first != nil && first.Err != nil:
		return nil, nil, first.Err
	case first != nil:
		return first.Q, ctx, nil
	case p.cfg.OwnTransaction:
		// A single statement on a pool runs in its own transaction.
		return p.db, ctx, nil
	default:
		return nil, nil, fmt.Errorf("%w: set it with outbox.WithTx(ctx, tx) on the message context, or enable OwnTransaction", ErrNoTx)
	}
}

// topic returns the cached partition count of topic, looking it up (in the
// caller's transaction) or registering it (through DB) on first use.
func (p *Publisher) topic(ctx context.Context, q pgexec.Querier, topic string) (*topicState, error) {
	p.mu.Lock()
	ts := p.topics[topic]
	p.mu.Unlock()
	if ts != nil {
		return ts, nil
	}
	n, _, err := lookupTopicPath(ctx, q, p.cfg.Schema, topic)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ts = p.topics[topic]; ts == nil {
		ts = &topicState{partitions: n}
		p.topics[topic] = ts
	}
	return ts, nil
}

// Close makes later Publish calls fail with ErrPublisherClosed. It does not
// touch the caller's transaction.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}

// notifyGate spaces the NOTIFYs that all Publishers of this process send on
// one channel (one schema).
type notifyGate struct{ last atomic.Int64 } // UnixNano of the last pass

var notifyGates sync.Map // channel name -> *notifyGate

func notifyGateFor(channel string) *notifyGate {
	if g, ok := notifyGates.Load(channel); ok {
		return g.(*notifyGate)
	}
	g, _ := notifyGates.LoadOrStore(channel, new(notifyGate))
	return g.(*notifyGate)
}

// pass reports whether a NOTIFY may be sent at now: interval < 0, or none
// passed within interval before now (a clock that went back counts as
// expired). Concurrent callers within one interval get one true.
func (g *notifyGate) pass(now time.Time, interval time.Duration) bool {
	if interval < 0 {
		return true
	}
	t := now.UnixNano()
	for {
		last := g.last.Load()
		if last != 0 && t >= last && t-last < int64(interval) {
			return false
		}
		if g.last.CompareAndSwap(last, t) {
			return true
		}
	}
}
