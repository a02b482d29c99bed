package forwarder

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// DefaultConsumerGroup is the outbox consumer group of a Forwarder whose
// Config.Subscriber.ConsumerGroup is empty.
const DefaultConsumerGroup = "outbox-forwarder"

// Target publishes batches of outbox messages to a broker.
//
// Send publishes batch, in order, to topic (the target topic or subject) and
// returns how many messages from the start of batch the broker confirmed.
// It follows the contract of outbox.BatchHandler: with done < len(batch) it
// returns the reason, and the rest is retried later with backoff; to take a
// message that can never be published out of the stream, it calls
// outbox.Reject(batch[i], cause) and returns done = i.
//
// To keep per-key order, a message must not become visible on the broker
// unless every message before it in batch is (a prefix property), as far as
// the broker allows; see the targets of this package.
type Target interface {
	Send(ctx context.Context, topic string, batch []*message.Message) (done int, err error)
}

// TargetFunc adapts a function to Target.
type TargetFunc func(ctx context.Context, topic string, batch []*message.Message) (int, error)

// Send calls f.
func (f TargetFunc) Send(ctx context.Context, topic string, batch []*message.Message) (int, error) {
	if f == nil {
		return 0, errs.NilArgument("forwarder.TargetFunc", "adapt a function that sends the batch")
	}
	return f(ctx, topic, batch)
}

// KeyIsolationChecker is implemented by a Target that cannot forward with
// the Subscriber's key isolation (outbox.KeyIsolation): with isolation, a
// held message is sent after newer messages of its partition. NewForwarder
// (Config.Validate) calls CheckKeyIsolation when Subscriber.KeyIsolation is
// enabled and refuses the config with its error (an *outboxtype.ConfigError);
// nil means the target works with isolation as it is configured. The Kafka
// target (package forwarder/kafka) refuses it for exactly-once delivery,
// whose takeover reads the partition's last record back and would take a
// held message for one already written.
type KeyIsolationChecker interface {
	CheckKeyIsolation() error
}

// TopicChecker is implemented by a Target that can check, when the
// Forwarder starts, that a destination exists and fits the outbox topic
// forwarded into it. Run calls CheckTopic for every outbox topic, with the
// destination (Config.TargetTopic) and the outbox topic's partition count
// (0 when it is not registered yet), before it forwards anything; an error
// stops Run with it. A target that cannot tell (its broker is unreachable)
// returns nil and says so in its log: the forwarder starts, and its sends
// are retried. The Kafka target (package forwarder/kafka) refuses a topic
// that does not exist (or creates it, kafka.Config.CreateTopics) and warns
// when its partition count differs from the outbox topic's.
type TopicChecker interface {
	CheckTopic(ctx context.Context, topic string, outboxPartitions int) error
}

// Config configures a Forwarder.
type Config struct {
	// Subscriber configures the outbox side: Pool (required), Schema,
	// ConsumerGroup (DefaultConsumerGroup when empty), Tuning (batch size,
	// backoff, leases), RejectHandler (where poison messages go: the
	// schema's dead-letter table unless set), MaxAttempts (default
	// outbox.RetryForever here: the targets reject what no retry can cure
	// on the first attempt, and a broker outage must not dead-letter
	// healthy messages out of their order), and so on. Its HandlerTimeout
	// bounds one Send. Strategy must be outbox.Leased (the default): a
	// broker publish cannot join a database transaction.
	Subscriber outbox.SubscriberConfig
	// Topics are the outbox topics to forward. Required.
	Topics []string
	// Source names the database this Forwarder reads, when several
	// databases forward into one broker (a sharded application; see
	// pipeline.Fleet, which sets it): ASCII letters, digits, '.', '_' and
	// '-'. Every message forwarded then carries it in metadata
	// outbox.MetadataSource (a Kafka header, a NATS header), because two
	// databases number their messages alike; the Kafka target puts it in
	// its transactional ids and reads back only its own records, the
	// JetStream target in its message ids, and the metrics label the
	// forwarder's series with it. Empty (the default) for one database:
	// no header, and the ids of earlier releases. Naming the source of a
	// running deployment changes its transactional ids: stop its
	// forwarders first (docs/sharding.md, "Naming a source").
	Source string
	// Target publishes the batches. Required. The Forwarder does not close
	// it.
	Target Target
	// TargetTopic maps an outbox topic to the topic (Kafka) or subject
	// (NATS) it is forwarded to. Default: the same name.
	TargetTopic func(outboxTopic string) string
	// Middlewares wrap the forwarding of each message as Watermill's
	// router middleware wraps a handler (the first is the outermost, as
	// router.AddMiddleware): metrics, tracing, logging, correlation ids,
	// Recoverer, Retry, PoisonQueue. The innermost handler forwards the
	// message, so a middleware sees its real outcome and duration, and a
	// message it changes (metadata) is forwarded changed. A chain that
	// returns an error makes the message a failed delivery (retried, and
	// rejected after MaxAttempts, as without middleware); a panic is an
	// error. Batches are still sent in one Send (see sendThrough); a
	// second call of the innermost handler (Retry) sends the message alone,
	// never ahead of an unfinished or failed message before it. Messages a
	// chain returns as produced are not published. Without middleware, no
	// goroutine per message is started.
	Middlewares []message.HandlerMiddleware
}

func (c *Config) setDefaults() {
	if c.Subscriber.ConsumerGroup == "" {
		c.Subscriber.ConsumerGroup = DefaultConsumerGroup
	}
	if c.Subscriber.MaxAttempts == 0 {
		// A target rejects what no retry can cure on its first attempt;
		// what fails otherwise is the broker (down, leaders moving), and
		// an outage must not take healthy messages out of their order.
		c.Subscriber.MaxAttempts = outbox.RetryForever
	}
	if c.TargetTopic == nil {
		c.TargetTopic = func(topic string) string { return topic }
	}
}

// Validate reports the first impossible setting.
func (c Config) Validate() error {
	c.setDefaults()
	if err := c.Subscriber.Validate(); err != nil {
		return err
	}
	switch {
	case c.Subscriber.Strategy != outbox.Leased:
		return &outboxtype.ConfigError{Field: "Subscriber.Strategy", Reason: "must be Leased: a broker publish cannot join a database transaction"}
	case len(c.Topics) == 0:
		return &outboxtype.ConfigError{Field: "Topics", Reason: "required"}
	case isNil(c.Target):
		return &outboxtype.ConfigError{Field: "Target", Reason: "required"}
	}
	if t, ok := c.Target.(KeyIsolationChecker); ok && c.Subscriber.KeyIsolation.Enabled {
		if err := t.CheckKeyIsolation(); err != nil {
			return err
		}
	}
	if c.Source != "" {
		if err := names.Source(c.Source); err != nil {
			return err
		}
	}
	for i, m := range c.Middlewares {
		if m == nil {
			return &outboxtype.ConfigError{Field: "Middlewares", Reason: fmt.Sprintf("entry %d is nil", i)}
		}
	}
	seen := map[string]bool{}
	for _, topic := range c.Topics {
		if err := names.Topic(topic); err != nil {
			return err
		}
		if seen[topic] {
			return &outboxtype.ConfigError{Field: "Topics", Reason: fmt.Sprintf("topic %q listed twice", topic)}
		}
		seen[topic] = true
		if c.TargetTopic(topic) == "" {
			return &outboxtype.ConfigError{Field: "TargetTopic", Reason: fmt.Sprintf("maps topic %q to an empty name", topic)}
		}
	}
	return nil
}

// Forwarder relays the messages of outbox topics to a broker. It reads the
// topics as a consumer group of the outbox (so any number of instances share
// the partitions, and a crashed instance's partitions move to the others)
// and hands each batch of one partition, in seq order, to the Target. The
// group's cursor moves past a batch only after the broker confirmed every
// message of it, so nothing committed is lost; a batch that failed halfway
// is sent again from its first unconfirmed message, so messages may arrive
// twice, each copy carrying the same outbox.MetadataID.
type Forwarder struct {
	cfg    Config
	logger watermill.LoggerAdapter
	sub    *outbox.Subscriber

	life startstop.Service

	mu    sync.Mutex
	loops map[string]*direct.Loop // the forwarder-only topics' (set by Run)

	counts forward.Counts
}

// NewForwarder creates a Forwarder; Run starts it.
func NewForwarder(cfg Config, logger watermill.LoggerAdapter) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	sub, err := outbox.NewSubscriber(cfg.Subscriber, logger)
	if err != nil {
		return nil, err
	}
	return &Forwarder{
		cfg:    cfg,
		logger: logger.With(forwarderFields(cfg)),
		sub:    sub,
		life:   startstop.Service{Name: "forwarder.Forwarder"},
	}, nil
}

// forwarderFields are the log fields of a Forwarder's lines.
func forwarderFields(cfg Config) watermill.LogFields {
	fields := watermill.LogFields{"component": "outbox.forwarder", "group": cfg.Subscriber.ConsumerGroup}
	if cfg.Source != "" {
		fields["source"] = cfg.Source
	}
	return fields
}

// Run forwards until ctx ends or the Forwarder is closed, and then returns
// nil (or the error that kept it from joining the group on a topic). It
// has the lifecycle of the outbox's long-running components
// (internal/startstop): it runs once; a second Run while it runs is
// ErrAlreadyRunning, a Run after it stopped ErrClosed.
func (f *Forwarder) Run(ctx context.Context) error {
	if f.sub == nil {
		return errs.NotConstructed("forwarder.Forwarder", "forwarder.NewForwarder")
	}
	return f.life.Run(ctx, nil, f.run)
}

// run joins the group on every topic and forwards until ctx ends.
func (f *Forwarder) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The targets name a Kafka transactional producer per outbox partition
	// and look for its records by the partition count; 0 (unknown, e.g.
	// the topic is not registered yet) makes them look everywhere. Every
	// destination is checked before anything is forwarded.
	partitions := make(map[string]int, len(f.cfg.Topics))
	for _, topic := range f.cfg.Topics {
		n, err := outbox.TopicPartitions(ctx, f.cfg.Subscriber.Pool, f.cfg.Subscriber.Schema, topic)
		if err != nil {
			n = 0
		}
		partitions[topic] = n
	}
	// Forwarder-only topics (outbox.ForwardOnly) take the short path
	// (internal/direct), the others the Subscriber's.
	loops := make(map[string]*direct.Loop, len(f.cfg.Topics))
	for _, topic := range f.cfg.Topics {
		loop, err := f.forwardOnly(ctx, topic, partitions[topic])
		if err != nil {
			return fmt.Errorf("forwarder: topic %s: %w", topic, err)
		}
		if loop != nil {
			loops[topic] = loop
		}
	}
	for _, topic := range f.cfg.Topics {
		if c, ok := f.cfg.Target.(TopicChecker); ok {
			if err := c.CheckTopic(ctx, f.cfg.TargetTopic(topic), partitions[topic]); err != nil {
				return fmt.Errorf("forwarder: topic %s: %w", topic, err)
			}
		}
	}
	f.mu.Lock()
	f.loops = loops
	f.mu.Unlock()
	errs := make(chan error, len(f.cfg.Topics))
	for _, topic := range f.cfg.Topics {
		if loop := loops[topic]; loop != nil {
			go func() {
				err := loop.Run(ctx)
				if err != nil {
					err = fmt.Errorf("forwarder: topic %s: %w", topic, err)
					cancel()
				}
				errs <- err
			}()
			continue
		}
		h := f.handler(topic, f.cfg.TargetTopic(topic), partitions[topic])
		go func() {
			err := f.sub.ConsumeBatches(ctx, topic, h)
			if err != nil {
				err = fmt.Errorf("forwarder: topic %s: %w", topic, err)
				cancel() // one topic failed to start: stop the others too
			}
			errs <- err
		}()
	}
	var first error
	for range f.cfg.Topics {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// forwardOnly returns the loop that forwards topic when it is
// forwarder-only (nil otherwise), or why it cannot be forwarded.
func (f *Forwarder) forwardOnly(ctx context.Context, topic string, partitions int) (*direct.Loop, error) {
	sc := f.cfg.Subscriber
	_, forwardOnly, err := direct.Lookup(ctx, sc.Pool, f.schema(), topic)
	if err != nil || !forwardOnly {
		return nil, nil // an unknown topic: the Subscriber says so
	}
	target, ok := direct.Adapt(f.cfg.Target)
	if !ok {
		return nil, &outboxtype.ConfigError{Field: "Target", Reason: fmt.Sprintf(
			"topic %q is forwarder-only (outbox.ForwardOnly), which only the Kafka target with exactly-once delivery forwards (a *kafka.Target without AtLeastOnce); this target is a %T", topic, f.cfg.Target)}
	}
	if len(f.cfg.Middlewares) > 0 {
		return nil, &outboxtype.ConfigError{Field: "Middlewares", Reason: fmt.Sprintf(
			"topic %q is forwarder-only (outbox.ForwardOnly), whose rounds are sent without middleware: forward it without Middlewares, or register a topic without ForwardOnly", topic)}
	}
	incarnation, err := direct.Incarnation(ctx, sc.Pool, f.schema(), topic)
	if err != nil {
		return nil, err
	}
	reject := sc.RejectHandler
	if reject == nil {
		store, err := deadletter.NewStore(deadletter.Config{Schema: f.schema(), Pool: sc.Pool}, f.logger)
		if err != nil {
			return nil, err
		}
		reject = store
	}
	tuning := sc.Tuning.WithDefaults()
	// A round's send ends before the leases can (as the Subscriber's
	// HandlerTimeout, which defaults to 2/3 of the lease TTL).
	sendTimeout := sc.HandlerTimeout
	if sendTimeout <= 0 || sendTimeout > tuning.LeaseTTL {
		sendTimeout = tuning.LeaseTTL / 3 * 2
	}
	source := f.cfg.Source
	return direct.New(direct.Config{
		Pool: sc.Pool, Schema: f.schema(), Group: sc.ConsumerGroup, Topic: topic, Source: source,
		Partitions: partitions, Incarnation: incarnation, TargetTopic: f.cfg.TargetTopic(topic), Target: target,
		Lease: lease.Config{
			TTL:             tuning.LeaseTTL,
			RenewInterval:   tuning.LeaseTTL / 5,
			BalanceInterval: min(lease.DefaultBalanceInterval, tuning.LeaseTTL/10),
			StartFromNewest: sc.StartFromNewest,
		},
		BatchSize:     tuning.BatchSize,
		Poll:          pollInterval(sc),
		Pace:          tuning.AppendInterval(),
		BackoffBase:   tuning.BackoffBase,
		BackoffMax:    tuning.BackoffMax,
		SendTimeout:   sendTimeout,
		RejectHandler: reject,
		Prepare: func(m *message.Message) {
			if source != "" {
				m.Metadata.Set(outbox.MetadataSource, source)
			} else {
				delete(m.Metadata, outbox.MetadataSource)
			}
		},
		Logger: f.logger,
	}), nil
}

// pollInterval is a forwarder-only topic's poll when no notification
// comes: the profile's sequencer poll (the partitions' safety-net poll
// when set).
func pollInterval(sc outbox.SubscriberConfig) time.Duration {
	if sc.Advanced.PollInterval > 0 {
		return sc.Advanced.PollInterval
	}
	return time.Second
}

// schema is the outbox schema the Forwarder reads.
func (f *Forwarder) schema() string {
	if f.cfg.Subscriber.Schema == "" {
		return outbox.DefaultSchema
	}
	return f.cfg.Subscriber.Schema
}

// Close stops the Forwarder and waits until Run has returned: in-flight
// sends get the Subscriber's CloseTimeout to finish, then are abandoned
// (their messages are sent again by whoever takes the partitions over);
// leases are released. Close does not close the Target.
func (f *Forwarder) Close() error {
	if f.sub == nil { // a zero Forwarder: nothing runs
		return nil
	}
	err := f.sub.Close()
	f.life.Close()
	return err
}

// Stats counts the Forwarder's work since it started.
type Stats struct {
	// Batches and Messages count the sends the broker confirmed entirely,
	// and the messages it confirmed (also of partly failed batches).
	Batches, Messages int64
	// Failures counts the sends that failed entirely or in part, Rejected
	// those of them that rejected a message as poison.
	Failures, Rejected int64
	// LastError is the error of the last failed send, if any.
	LastError string
}

// Stats returns the Forwarder's counters.
func (f *Forwarder) Stats() Stats {
	c := &f.counts
	s := Stats{Batches: c.Batches.Load(), Messages: c.Messages.Load(), Failures: c.Failures.Load(), Rejected: c.Rejected.Load()}
	f.mu.Lock()
	for _, l := range f.loops {
		d := l.Stats()
		s.Batches += d.Rounds
		s.Messages += d.Messages
		s.Failures += d.Failures
		s.Rejected += d.Rejected
	}
	f.mu.Unlock()
	if e := c.LastError.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// Consumer returns what Run consumes topic with: the Subscriber config
// (with the Forwarder's defaults) and the batch handler that sends to the
// Target. outboxtest.NewBatchRunner drives them synchronously, so that a
// test can forward everything committed and then look at the broker
// without sleeping; services use Run. topic must be one of Config.Topics.
func (f *Forwarder) Consumer(ctx context.Context, topic string) (outbox.SubscriberConfig, outbox.BatchHandler, error) {
	if f.sub == nil {
		return outbox.SubscriberConfig{}, nil, errs.NotConstructed("forwarder.Forwarder", "forwarder.NewForwarder")
	}
	if !slices.Contains(f.cfg.Topics, topic) {
		return outbox.SubscriberConfig{}, nil, &outboxtype.ConfigError{Field: "topic", Reason: fmt.Sprintf("%q is not one of the Forwarder's Topics %q", topic, f.cfg.Topics)}
	}
	partitions, err := outbox.TopicPartitions(ctx, f.cfg.Subscriber.Pool, f.cfg.Subscriber.Schema, topic)
	if err != nil {
		partitions = 0 // as Run: the targets then look everywhere
	}
	return f.cfg.Subscriber, f.handler(topic, f.cfg.TargetTopic(topic), partitions), nil
}

// handler forwards the batches of one outbox topic to targetTopic
// (internal/forward).
func (f *Forwarder) handler(topic, targetTopic string, partitions int) outbox.BatchHandler {
	schema := f.cfg.Subscriber.Schema
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	send := forward.TargetSend(f.cfg.Target)
	if len(f.cfg.Middlewares) > 0 {
		send = f.sendThrough
	}
	return forward.Handler(forward.Config{
		Source: f.cfg.Source, Schema: schema, Group: f.cfg.Subscriber.ConsumerGroup,
		Topic: topic, TargetTopic: targetTopic, Partitions: partitions,
		Send: send, Counts: &f.counts, Logger: f.logger,
	})
}
