package outbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/notifier"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgtext"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/worker"
	"github.com/millrace/watermill-outbox/partitioning"
)

// Strategy says how a Subscriber's handler runs relative to the database.
type Strategy int

const (
	// Leased runs the handler outside any transaction, while the instance
	// holds the partition's lease, with a deadline before the lease could
	// end. Delivery is at-least-once: a message whose handler finished just
	// as the lease was lost is delivered again (same MetadataID).
	Leased Strategy = iota
	// Transactional runs the handler while the partition's transaction is
	// open; the handler gets it with TxFromContext(msg.Context()), and its
	// writes commit atomically with the cursor: exactly-once effects inside
	// PostgreSQL. Each message runs under a savepoint, so a Nack undoes only
	// that message's writes.
	Transactional
)

func (s Strategy) String() string {
	switch s {
	case Leased:
		return "leased"
	case Transactional:
		return "transactional"
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Schema is the outbox schema (DefaultSchema when empty).
	Schema string
	// Pool is the connection pool. Required.
	Pool *pgxpool.Pool
	// ConsumerGroup names the group whose cursor this subscriber advances.
	// Subscribers in one group share the partitions; each group sees every
	// message. Required: 1 to 200 bytes of UTF-8 without control or format
	// characters (a *NameError otherwise).
	ConsumerGroup string
	// Strategy is Leased (default) or Transactional.
	Strategy Strategy
	// Tuning sets batch sizes, pacing, backoff, leases and the bulkhead;
	// start from a profile (adaptive.Default() when zero).
	Tuning adaptive.Tuning
	// StartFromNewest makes a new group start after the messages already
	// sequenced instead of at the oldest retained one.
	StartFromNewest bool
	// Topics, AutoCreateTopics and DefaultPartitions work as in
	// PublisherConfig: a subscriber may come up before any publisher.
	Topics            map[string]int
	AutoCreateTopics  bool
	DefaultPartitions int
	// RejectHandler takes rejected (poison) messages out of the stream, e.g.
	// the dead-letter store. Without one, a message rejected with Reject is
	// retried like a nacked one (nothing is ever dropped silently), a
	// message that keeps failing stalls its partition for ever, and the
	// Subscriber says so when it starts (a warning) and in the admin status;
	// a handler can still take a message out with RejectTo (which the
	// deadletter PoisonQueue publisher uses).
	RejectHandler RejectHandler
	// MaxAttempts, when > 0, rejects a message delivered that many times
	// without success (needs RejectHandler). Every failure counts: a Nack,
	// an error, a HandlerTimeout, a transaction the handler broke, a
	// missing payload, and a delivery that ended without any outcome
	// because the consumer process died, was killed or lost its lease while
	// it was the only delivery in flight in that process. A crash with
	// several deliveries in flight charges none of them: they are delivered
	// again one at a time, each alone in its process, until the one that
	// crashes it is found (docs/failure-modes.md §3).
	MaxAttempts int
	// HandlerTimeout bounds how long the Subscriber waits for a handler's
	// Ack or Nack (or a BatchHandler's return), in both strategies (default
	// LeaseTTL - RenewInterval, so it ends before the lease can). The
	// message's context ends then too. A handler that has not answered by
	// then is abandoned: the delivery counts as a failed attempt
	// (ErrHandlerTimeout, visible in the status), its late Ack or Nack
	// changes nothing, and in the Transactional strategy its transaction is
	// rolled back (its later statements fail). The abandoned handler's
	// goroutine is the caller's: it ends when the handler returns; at most
	// one per timed-out delivery, so at most MaxAttempts per message.
	HandlerTimeout time.Duration
	// CloseTimeout bounds how long Close waits for in-flight messages to be
	// acked or nacked (default 5s); unfinished ones are treated as nacked.
	CloseTimeout time.Duration
	// DisableSequencer stops the subscriber from running a Sequencer of its
	// own. Some process must run one; any number may run.
	DisableSequencer bool
	// SyncCursorCommits makes the Leased strategy commit each cursor move
	// with synchronous_commit on. By default a Leased cursor move commits
	// without waiting for the server's WAL flush (see
	// lease.Lease.AdvanceRelaxed): after a crash of the PostgreSQL server,
	// the messages of the last few hundred milliseconds of cursor moves are
	// delivered again, which the Leased strategy's at-least-once delivery
	// allows. The Transactional strategy always commits synchronously.
	SyncCursorCommits bool
	// Sequencer tunes the Subscriber's own Sequencer; its Schema and Pool
	// are always the Subscriber's, and its MinPassInterval defaults to
	// Tuning.SequencerInterval.
	Sequencer SequencerConfig
	// MemberID identifies this instance in leases (default: random).
	MemberID string
	// KeyIsolation, when Enabled, holds a failing message back with the
	// later messages of its key instead of blocking the whole partition
	// (see KeyIsolation).
	KeyIsolation KeyIsolation
	// BalanceInterval is how often the instance re-evaluates its share of
	// the partitions and the paused ones: the latency of a rebalance or a
	// pause (default 1s; must be below Tuning.LeaseTTL).
	BalanceInterval time.Duration
}

// sequencerConfig is the configuration of the Subscriber's own Sequencer.
func (c SubscriberConfig) sequencerConfig() SequencerConfig {
	sc := c.Sequencer
	sc.Schema, sc.Pool = c.Schema, c.Pool
	if sc.MinPassInterval == 0 {
		sc.MinPassInterval = c.Tuning.SequencerInterval
	}
	return sc
}

func (c *SubscriberConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Tuning == (adaptive.Tuning{}) {
		c.Tuning = adaptive.Default()
	}
	if c.DefaultPartitions == 0 {
		c.DefaultPartitions = 1
	}
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = c.Tuning.LeaseTTL - c.Tuning.RenewInterval
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 5 * time.Second
	}
	if c.MemberID == "" {
		c.MemberID = watermill.NewShortUUID()
	}
	if c.BalanceInterval == 0 {
		c.BalanceInterval = lease.DefaultBalanceInterval
	}
}

// Validate reports the first impossible setting.
func (c SubscriberConfig) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	if err := c.Tuning.Validate(); err != nil {
		return &errs.ConfigError{Field: "Tuning", Reason: err.Error()}
	}
	if c.Pool != nil && !c.DisableSequencer {
		if err := c.sequencerConfig().Validate(); err != nil {
			var ce *errs.ConfigError
			if errors.As(err, &ce) {
				return &errs.ConfigError{Field: "Sequencer." + ce.Field, Reason: ce.Reason}
			}
			return err
		}
	}
	switch {
	case c.Pool == nil:
		return &errs.ConfigError{Field: "Pool", Reason: "required"}
	case c.ConsumerGroup == "":
		return &errs.ConfigError{Field: "ConsumerGroup", Reason: "required"}
	case names.Group(c.ConsumerGroup) != nil:
		return names.Group(c.ConsumerGroup) // a *NameError
	case c.Strategy != Leased && c.Strategy != Transactional:
		return &errs.ConfigError{Field: "Strategy", Reason: "must be Leased or Transactional"}
	case c.MaxAttempts < 0:
		return &errs.ConfigError{Field: "MaxAttempts", Reason: "must be >= 0"}
	case c.RejectHandler != nil && isNil(c.RejectHandler):
		return &errs.ConfigError{Field: "RejectHandler", Reason: fmt.Sprintf("is a nil %T: give it a handler (e.g. a deadletter.Store from deadletter.New), or leave the field nil", c.RejectHandler)}
	case c.MaxAttempts > 0 && c.RejectHandler == nil:
		return &errs.ConfigError{Field: "MaxAttempts", Reason: "needs a RejectHandler to take exhausted messages out"}
	case c.HandlerTimeout < 0 || c.HandlerTimeout > c.Tuning.LeaseTTL:
		return &errs.ConfigError{Field: "HandlerTimeout", Reason: "must be positive and at most Tuning.LeaseTTL"}
	case c.CloseTimeout < 0:
		return &errs.ConfigError{Field: "CloseTimeout", Reason: "must be positive"}
	case len(c.MemberID) > 160 || !pgtext.Storable(c.MemberID):
		return &errs.ConfigError{Field: "MemberID", Reason: "at most 160 bytes of UTF-8 without NUL (a suffix per subscription is added)"}
	case c.Tuning.LeaseTTL < 100*time.Millisecond:
		return &errs.ConfigError{Field: "Tuning.LeaseTTL", Reason: "must be at least 100ms"}
	case c.BalanceInterval < 0 || c.BalanceInterval >= c.Tuning.LeaseTTL:
		return &errs.ConfigError{Field: "BalanceInterval", Reason: "must be positive and below Tuning.LeaseTTL"}
	}
	if err := c.KeyIsolation.Validate(); err != nil {
		return err
	}
	if err := partitioning.ValidatePartitions(c.DefaultPartitions); err != nil {
		return &errs.ConfigError{Field: "DefaultPartitions", Reason: err.Error()}
	}
	for topic, n := range c.Topics {
		if err := names.Topic(topic); err != nil {
			return err
		}
		if err := partitioning.ValidatePartitions(n); err != nil {
			return &errs.ConfigError{Field: "Topics[" + topic + "]", Reason: err.Error()}
		}
	}
	return nil
}

// Subscriber is a message.Subscriber over the sequenced outbox log. Each
// Subscribe call joins the consumer group on a topic: the instance takes
// leases on its fair share of the topic's partitions and runs one worker
// per leased partition. A worker reads a batch in seq order, delivers its
// messages one at a time (the next only after the previous was acked), and
// moves the group's cursor once per batch, fenced by its lease.
type Subscriber struct {
	cfg    SubscriberConfig
	logger watermill.LoggerAdapter
	db     pgexec.DB

	workers   *consumer.Config // what the partition workers share
	sequencer *Sequencer

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	started  bool
	pokers   map[string]map[int]map[*worker.Poker]struct{} // topic -> partition -> pokers
	topicsMu sync.Mutex
	topics   map[string]int
}

// NewSubscriber creates a Subscriber.
func NewSubscriber(cfg SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	bulkhead, err := worker.NewBulkhead(cfg.Tuning.MaxConcurrentPartitions)
	if err != nil {
		return nil, err
	}
	db, _ := pgexec.FromDB(cfg.Pool)
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{
		cfg:    cfg,
		logger: logger.With(watermill.LogFields{"component": "outbox.subscriber", "group": cfg.ConsumerGroup}),
		db:     db,
		ctx:    ctx,
		cancel: cancel,
		pokers: map[string]map[int]map[*worker.Poker]struct{}{},
		topics: map[string]int{},
	}
	s.workers = &consumer.Config{
		Group:             cfg.ConsumerGroup,
		Transactional:     cfg.Strategy == Transactional,
		MaxAttempts:       cfg.MaxAttempts,
		HandlerTimeout:    cfg.HandlerTimeout,
		CloseTimeout:      cfg.CloseTimeout,
		SyncCursorCommits: cfg.SyncCursorCommits,
		Tuning:            cfg.Tuning,
		RejectHandler:     cfg.RejectHandler,
		Isolation:         cfg.KeyIsolation.delivery(),
		Store:             consumer.NewStore(cfg.Pool, cfg.Schema, cfg.ConsumerGroup, ctx, &s.wg),
		Careful:           &consumer.Careful{},
		Bulkhead:          bulkhead,
		Logger:            s.logger,
		Register:          s.addPoker,
		Stop:              ctx,
		Background:        &s.wg,
		Counts:            &consumer.Counts{},
	}
	if !cfg.DisableSequencer {
		s.sequencer, err = NewSequencer(cfg.sequencerConfig(), logger)
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// SubscribeInitialize registers topic if needed (AutoCreateTopics or
// Topics), so that messages published before the first Subscribe are kept
// for the group.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if s == nil || s.workers == nil {
		return errNotConstructed
	}
	if err := names.Topic(topic); err != nil {
		return err
	}
	if err := s.checkSchema(s.ctx); err != nil {
		return err
	}
	_, err := s.topic(s.ctx, topic)
	return s.schemaError(err)
}

// checkSchema refuses a schema that was never migrated (ErrNotMigrated) or
// was migrated by a newer release (ErrSchemaTooNew); one query per pool
// and schema per process.
func (s *Subscriber) checkSchema(ctx context.Context) error {
	return schemacheck.Check(ctx, s.cfg.Pool, s.db, s.cfg.Schema)
}

// schemaError turns the "relation does not exist" of a dropped schema into
// ErrNotMigrated.
func (s *Subscriber) schemaError(err error) error { return schemacheck.Wrap(err, s.cfg.Schema) }

func (s *Subscriber) topic(ctx context.Context, topic string) (int, error) {
	s.topicsMu.Lock()
	n, ok := s.topics[topic]
	s.topicsMu.Unlock()
	if ok {
		return n, nil
	}
	want, listed := s.cfg.Topics[topic]
	n, err := lookupTopic(ctx, s.db, s.cfg.Schema, topic)
	switch {
	case err == nil && listed && n != want:
		return 0, &errs.PartitionMismatchError{Topic: topic, Registered: n, Requested: want}
	case errors.Is(err, errs.ErrUnknownTopic) && (listed || s.cfg.AutoCreateTopics):
		if !listed {
			want = s.cfg.DefaultPartitions
		}
		if n, err = registerTopic(ctx, s.db, s.cfg.Schema, topic, want); err != nil {
			return 0, err
		}
	case err != nil:
		return 0, err
	}
	s.topicsMu.Lock()
	s.topics[topic] = n
	s.topicsMu.Unlock()
	return n, nil
}

// Subscribe joins the consumer group on topic and returns the channel its
// messages arrive on. The channel is closed when ctx ends or the Subscriber
// is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s == nil || s.workers == nil {
		return nil, errNotConstructed
	}
	out := make(chan *message.Message)
	if _, err := s.join(ctx, topic, out, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// BatchHandler processes consecutive messages of one partition, in seq
// order, and returns how many of them, from the start, are done. When
// done < len(batch), err says why; the rest is retried with backoff and the
// batch shrinks (adaptive degradation). To take a message out of the stream
// for good, call Reject(batch[i], cause) and return done = i: it goes to the
// RejectHandler and the stream moves on. Messages carry the same metadata as
// those of Subscribe.
type BatchHandler func(ctx context.Context, batch []*message.Message) (done int, err error)

// ConsumeBatches joins the consumer group on topic, like Subscribe, and
// hands whole batches to h instead of single messages: the cursor moves
// once per batch, past the done prefix. Use it where a batch can be
// processed in one go, e.g. one round trip to a broker. It blocks until ctx
// ends or the Subscriber is closed, and then returns nil.
func (s *Subscriber) ConsumeBatches(ctx context.Context, topic string, h BatchHandler) error {
	if s == nil || s.workers == nil {
		return errNotConstructed
	}
	if h == nil {
		return &errs.ConfigError{Field: "BatchHandler", Reason: "must not be nil"}
	}
	done, err := s.join(ctx, topic, nil, h)
	if err != nil {
		return err
	}
	<-done
	return nil
}

// join makes this instance a member of the group on topic: it takes leases
// on its share of the partitions and runs a worker per leased partition,
// delivering to out or to batch. When ctx ends or the Subscriber closes and
// every worker has stopped, it closes out (before Close can return) and the
// returned channel.
func (s *Subscriber) join(ctx context.Context, topic string, out chan *message.Message, batch BatchHandler) (<-chan struct{}, error) {
	if err := names.Topic(topic); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errs.ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	started := false
	defer func() {
		if !started {
			s.wg.Done()
		}
	}()

	sub, err := s.prepare(ctx, topic, out, batch)
	if err != nil {
		return nil, err
	}
	// The sequencer and the listener start with the first Subscribe that
	// succeeds (not the first one tried: it may have failed because the
	// schema was not migrated yet, or the database was down).
	s.mu.Lock()
	first := !s.started
	s.started = true
	s.mu.Unlock()
	if first {
		s.startBackground()
		if s.cfg.RejectHandler == nil {
			warn(s.logger, "Subscriber has no RejectHandler: a message that keeps failing is retried for ever and stalls its partition. "+
				"Set SubscriberConfig.RejectHandler (e.g. a deadletter.Store) and MaxAttempts, or reject from the handler with outbox.RejectTo / the PoisonQueue middleware with deadletter.Store.PoisonPublisher",
				watermill.LogFields{"max_attempts": s.cfg.MaxAttempts})
		}
	}

	done := make(chan struct{})
	subCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	started = true
	go func() {
		defer s.wg.Done()
		defer close(done)
		defer func() {
			if out != nil {
				close(out)
			}
		}()
		defer stop()
		defer cancel()
		// The lease manager fails only when it cannot start (its first
		// statements failed: the database is unreachable, say); the
		// subscription tries again with the shared backoff rather than end
		// as if closed.
		sub.Run(subCtx, func(err error, attempt int, wait time.Duration) {
			s.logger.Error("Cannot join the consumer group, retrying", s.schemaError(err),
				watermill.LogFields{"topic": topic, "attempt": attempt, "retry_in": wait})
		})
	}()
	return done, nil
}

// prepare checks the schema, looks topic up and makes the subscription to
// it: its lease manager, its incarnation (MetadataIncarnation), where its
// messages go (out, or batch).
func (s *Subscriber) prepare(ctx context.Context, topic string, out chan<- *message.Message, batch BatchHandler) (*consumer.Subscription, error) {
	if err := s.checkSchema(ctx); err != nil {
		return nil, err
	}
	partitions, err := s.topic(ctx, topic)
	if err != nil {
		return nil, s.schemaError(err)
	}
	var incarnation int64
	if err := pgexec.QueryRow(ctx, s.db, dbsql.For(s.cfg.Schema).TopicsIncarnation, []any{topic}, &incarnation); err != nil {
		return nil, s.schemaError(fmt.Errorf("outbox: read the incarnation of topic %q: %w", topic, err))
	}
	manager, err := lease.NewManager(lease.Config{
		Schema:          s.cfg.Schema,
		Pool:            s.cfg.Pool,
		Group:           s.cfg.ConsumerGroup,
		Topic:           topic,
		Partitions:      partitions,
		MemberID:        s.cfg.MemberID + "-" + watermill.NewShortUUID(),
		TTL:             s.cfg.Tuning.LeaseTTL,
		RenewInterval:   s.cfg.Tuning.RenewInterval,
		BalanceInterval: s.cfg.BalanceInterval,
		StartFromNewest: s.cfg.StartFromNewest,
		NoRejectHandler: s.cfg.RejectHandler == nil,
	}, s.logger)
	if err != nil {
		return nil, err
	}
	var handler consumer.BatchHandler
	if batch != nil {
		handler = batch
	}
	return consumer.NewSubscription(s.workers, manager, topic, strconv.FormatInt(incarnation, 10), out, handler), nil
}

// Subscription returns this Subscriber's delivery of topic, to be driven
// one turn at a time by its caller instead of by goroutines of its own:
// what package outboxtest's Runner is made of. Its messages go to out (one
// at a time), or to batch when it is not nil. Programs use Subscribe or
// ConsumeBatches.
func (s *Subscriber) Subscription(ctx context.Context, topic string, out chan<- *message.Message, batch BatchHandler) (*consumer.Subscription, error) {
	if s == nil || s.workers == nil {
		return nil, errNotConstructed
	}
	if err := names.Topic(topic); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, errs.ErrClosed
	}
	return s.prepare(ctx, topic, out, batch)
}

// isClosed reports whether Close was called.
func (s *Subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// startBackground starts the notification listener and, unless disabled,
// the sequencer; both stop on Close.
func (s *Subscriber) startBackground() {
	// The process's shared LISTEN connection for this pool; given up when
	// the Subscriber closes.
	sub := notifier.Listen(s.cfg.Pool, names.SequencedChannel(s.cfg.Schema), s.logger, s.onSequenced)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-s.ctx.Done()
		sub.Unlisten()
	}()
	if s.sequencer != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = s.sequencer.Run(s.ctx)
		}()
	}
}

// onSequenced wakes the workers of the partitions named in a sequencer
// notification ("topic:p1,p2,…"); an empty payload (after a reconnect, when
// notifications may have been lost) wakes every worker.
func (s *Subscriber) onSequenced(payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	topic, list, ok := strings.Cut(payload, ":")
	if payload == "" || !ok {
		for _, parts := range s.pokers {
			for _, ps := range parts {
				for p := range ps {
					p.Poke()
				}
			}
		}
		return
	}
	parts := s.pokers[topic]
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		for p := range parts[n] {
			p.Poke()
		}
	}
}

func (s *Subscriber) addPoker(topic string, partition int, p *worker.Poker) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pokers[topic] == nil {
		s.pokers[topic] = map[int]map[*worker.Poker]struct{}{}
	}
	if s.pokers[topic][partition] == nil {
		s.pokers[topic][partition] = map[*worker.Poker]struct{}{}
	}
	s.pokers[topic][partition][p] = struct{}{}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.pokers[topic][partition], p)
	}
}

// Close stops every subscription: workers finish or nack their in-flight
// message (within CloseTimeout), leases are released, channels are closed,
// and Close returns when every goroutine has ended.
func (s *Subscriber) Close() error {
	if s == nil || s.workers == nil {
		return nil // nothing was started
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// SubscriberStats are running totals of a Subscriber's deliveries, over all
// its subscriptions.
type SubscriberStats struct {
	// Acked, Nacked, Rejected and TimedOut count deliveries by outcome (a
	// batch of ConsumeBatches counts each message).
	Acked, Nacked, Rejected, TimedOut int64
	// Crashed counts deliveries by earlier holders of this Subscriber's
	// partitions that ended without an outcome (the process died or lost
	// its lease), found when it acquired them: each counted as a failed
	// attempt.
	Crashed int64
	// Batches counts the batches read from the log.
	Batches int64
}

// Stats returns the Subscriber's running totals.
func (s *Subscriber) Stats() SubscriberStats {
	if s == nil || s.workers == nil {
		return SubscriberStats{}
	}
	c := s.workers.Counts
	return SubscriberStats{
		Acked: c.Acked.Load(), Nacked: c.Nacked.Load(), Rejected: c.Rejected.Load(), TimedOut: c.TimedOut.Load(),
		Crashed: c.Crashed.Load(), Batches: c.Batches.Load(),
	}
}

// errNotConstructed is what the methods of a Subscriber that NewSubscriber
// did not make return.
var errNotConstructed = errs.NotConstructed("outbox.Subscriber", "outbox.NewSubscriber")

// isNil reports whether v, a non-nil interface, holds a nil pointer, func,
// map, slice, channel or interface: a handler that would panic when called.
func isNil(v any) bool {
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface:
		return r.IsNil()
	}
	return false
}
