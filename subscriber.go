package outbox

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/notifier"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/runnerhook"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/internal/worker"
	"github.com/millrace/watermill-outbox/outboxtype"
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

	store     *consumer.PGStore // the group's statements (workers.Store)
	workers   *consumer.Config  // what the partition workers share
	sequencer *Sequencer

	// life is the Subscriber's lifecycle (internal/startstop): started by
	// the first Subscribe (or a Runner's subscription), it runs every
	// goroutine of the Subscriber: each subscription, the notification
	// listener's, the sequencer; Close stops them and waits. tasks, the
	// goroutines the workers leave behind their turns, start and stop with
	// it.
	life  startstop.Service
	tasks *consumer.Tasks
	// exit, when set (tests), is called by each background goroutine as it
	// ends, with its name.
	exit func(what string)

	mu         sync.Mutex
	running    bool                                          // life was started
	background bool                                          // the listener and the sequencer were started
	pokers     map[string]map[int]map[*worker.Poker]struct{} // topic -> partition -> pokers
	topicsMu   sync.Mutex
	topics     map[string]int
	joined     map[string]int // the partitions of the topics joined, for checkPool
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
	bulkhead, err := worker.NewBulkhead(cfg.Advanced.MaxConcurrentPartitions)
	if err != nil {
		return nil, err
	}
	db, _ := pgexec.FromDB(cfg.Pool)
	s := &Subscriber{
		cfg:    cfg,
		logger: logger.With(watermill.LogFields{"component": "outbox.subscriber", "group": cfg.ConsumerGroup}),
		db:     db,
		life:   startstop.Service{Name: "outbox.Subscriber"},
		tasks:  consumer.NewTasks(),
		pokers: map[string]map[int]map[*worker.Poker]struct{}{},
		topics: map[string]int{},
	}
	s.store = consumer.NewStore(cfg.Pool, cfg.Schema, cfg.ConsumerGroup, s.tasks)
	s.workers = &consumer.Config{
		Group:             cfg.ConsumerGroup,
		Transactional:     cfg.Strategy == Transactional,
		MaxAttempts:       max(cfg.MaxAttempts, 0), // RetryForever: 0, never exhausted
		HandlerTimeout:    cfg.HandlerTimeout,
		CloseTimeout:      cfg.CloseTimeout,
		SyncCursorCommits: cfg.Advanced.SyncCursorCommits,
		Tuning:            cfg.settings(),
		RejectHandler:     cfg.RejectHandler,
		Isolation:         cfg.KeyIsolation.delivery(),
		Store:             s.store,
		Careful:           &consumer.Careful{},
		Bulkhead:          bulkhead,
		Logger:            s.logger,
		Register:          s.addPoker,
		Tasks:             s.tasks,
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

// SubscribeInitialize checks that topic is registered (RegisterTopic
// registers topics; an unregistered one is ErrUnknownTopic) and the schema
// usable, so that a Router learns of either before it runs.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if s == nil || s.workers == nil {
		return errNotConstructed
	}
	if err := names.Topic(topic); err != nil {
		return err
	}
	if s.life.Closed() {
		return ErrClosed
	}
	ctx := context.Background()
	if err := s.checkSchema(ctx); err != nil {
		return err
	}
	_, err := s.topic(ctx, topic)
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
	n, forwardOnly, err := lookupTopicPath(ctx, s.db, s.cfg.Schema, topic)
	if err != nil {
		return 0, err
	}
	if forwardOnly {
		return 0, fmt.Errorf("%w: %q was registered with outbox.ForwardOnly: its messages never reach the log a Subscriber reads; only a Forwarder reads it (register a topic without ForwardOnly for Subscribers)", ErrForwardOnly, topic)
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
		return &outboxtype.ConfigError{Field: "BatchHandler", Reason: "must not be nil"}
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
// delivering to out or to batch. It all runs on a goroutine of the
// Subscriber's (Close waits for it, the preparation included): when ctx
// ends or the Subscriber closes and every worker has stopped, it closes out
// (before Close can return) and the returned channel.
func (s *Subscriber) join(ctx context.Context, topic string, out chan *message.Message, batch BatchHandler) (<-chan struct{}, error) {
	if err := names.Topic(topic); err != nil {
		return nil, err
	}
	if err := s.start(); err != nil {
		return nil, err
	}
	prepared := make(chan error, 1)
	done := make(chan struct{})
	if !s.life.Spawn(func(life context.Context) {
		defer close(done)
		defer s.exited("subscription")
		sub, err := s.prepare(ctx, topic, out, batch)
		if err != nil {
			prepared <- err
			return
		}
		// The sequencer and the listener start with the first Subscribe
		// that succeeds (not the first one tried: it may have failed
		// because the schema was not migrated yet, or the database was
		// down), before it returns.
		s.startBackground()
		prepared <- nil
		subCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(life, cancel)()
		// The lease manager fails only when it cannot start (its first
		// statements failed: the database is unreachable, say); the
		// subscription tries again with the shared backoff rather than end
		// as if closed.
		sub.Run(subCtx, func(err error, attempt int, wait time.Duration) {
			s.logger.Error("Cannot join the consumer group, retrying", s.schemaError(err),
				watermill.LogFields{"topic": topic, "attempt": attempt, "retry_in": wait})
		})
		if out != nil {
			close(out)
		}
	}) {
		return nil, ErrClosed // closed since start
	}
	if err := <-prepared; err != nil {
		return nil, err
	}
	return done, nil
}

// start starts the Subscriber's lifecycle, and its Tasks, unless they run:
// ErrClosed once Close was called.
func (s *Subscriber) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life.Closed() {
		return ErrClosed
	}
	if s.running {
		return nil
	}
	// The Tasks first: the workers hand them work from their first turn.
	if err := s.tasks.Start(context.Background()); err != nil {
		return err
	}
	if err := s.life.Start(context.Background(), s.run); err != nil {
		s.tasks.Stop()
		return ErrClosed // Close came in between
	}
	s.running = true
	return nil
}

// run is the Subscriber's life: it waits for Close, then stops the Tasks
// (the waits for abandoned handlers end, the Marker's connection closes),
// at the moment every other goroutine of the Subscriber is told to stop.
func (s *Subscriber) run(ctx context.Context) {
	<-ctx.Done()
	s.tasks.Stop()
	s.exited("tasks")
}

// exited calls the test hook, if any, as the background goroutine what
// ends.
func (s *Subscriber) exited(what string) {
	if s.exit != nil {
		s.exit(what)
	}
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
	if err := s.checkPool(topic, partitions); err != nil {
		return nil, err
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
		MemberID:        s.cfg.memberID() + "-" + watermill.NewShortUUID(),
		TTL:             s.cfg.Tuning.LeaseTTL,
		RenewInterval:   s.cfg.renewInterval(),
		BalanceInterval: s.cfg.balanceInterval(),
		StartFromNewest: s.cfg.StartFromNewest,
		Relaxed:         s.store.Relaxed(),
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

func init() {
	runnerhook.Subscription = func(sub any, ctx context.Context, topic string, out chan<- *message.Message, batch consumer.BatchHandler) (*consumer.Subscription, error) {
		s, _ := sub.(*Subscriber)
		return s.subscription(ctx, topic, out, batch)
	}
}

// subscription returns this Subscriber's delivery of topic, to be driven
// one turn at a time by its caller instead of by goroutines of its own:
// what package outboxtest's Runner is made of (through internal/runnerhook).
// Its messages go to out (one at a time), or to batch when it is not nil.
// Programs use Subscribe or ConsumeBatches.
func (s *Subscriber) subscription(ctx context.Context, topic string, out chan<- *message.Message, batch consumer.BatchHandler) (*consumer.Subscription, error) {
	if s == nil || s.workers == nil {
		return nil, errNotConstructed
	}
	if err := names.Topic(topic); err != nil {
		return nil, err
	}
	// Its workers hand the Subscriber's Tasks work: they run until Close.
	if err := s.start(); err != nil {
		return nil, err
	}
	return s.prepare(ctx, topic, out, batch)
}

// startBackground starts, once, the notification listener and, unless
// disabled, the sequencer: goroutines of the Subscriber's, which stop on
// Close.
func (s *Subscriber) startBackground() {
	s.mu.Lock()
	first := !s.background
	s.background = true
	s.mu.Unlock()
	if !first {
		return
	}
	// The process's shared LISTEN connection for this pool; given up when
	// the Subscriber closes.
	sub := notifier.Listen(s.cfg.Pool, names.SequencedChannel(s.cfg.Schema), s.logger, s.onSequenced)
	if !s.life.Spawn(func(ctx context.Context) {
		defer s.exited("listener")
		<-ctx.Done()
		sub.Unlisten()
	}) {
		sub.Unlisten() // closing already
	}
	if s.sequencer != nil {
		s.life.Spawn(func(ctx context.Context) {
			defer s.exited("sequencer")
			// Run returns an error only for a schema it cannot work with,
			// which Subscribe checked first (a schema dropped or migrated
			// by a newer release since): said, not swallowed, since
			// nothing is sequenced without it.
			if err := s.sequencer.Run(ctx); err != nil {
				s.logger.Error("The Subscriber's sequencer stopped: nothing new is delivered until the schema is mended and the Subscriber restarted", err, nil)
			}
		})
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
	s.life.Close()
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
