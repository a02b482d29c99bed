package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/inbox"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/pipeline"
	"github.com/millrace/watermill-outbox/relay"
)

// EnvChild names the environment variable that makes the test binary run
// as a child process of a chaos run (TestChaosChild): it holds the child's
// ChildConfig as JSON.
const EnvChild = "OUTBOX_CHAOS_CHILD"

// The roles of child processes.
const (
	// RoleTransactional is a Subscriber of the Transactional strategy
	// that records each delivery in the results table, in the delivery's
	// transaction: exactly-once.
	RoleTransactional = "transactional"
	// RoleLeased is a Subscriber of the Leased strategy that records each
	// delivery in the results table on its own, then acks: at-least-once.
	RoleLeased = "leased"
	// RoleForwarder is a Forwarder to Kafka.
	RoleForwarder = "forwarder"
	// RoleRelay is the log-based mode's relay as `outbox pipeline --wal`
	// runs it (a pipeline.Pipeline with a relay.Relay and a sequencer),
	// without retention, which would delete the log rows the verifier
	// reads: it streams the schema's slot into the log, or waits as a
	// standby while another relay streams it.
	RoleRelay = "relay"
	// RoleFleet is a pipeline.Fleet over several databases (ChildConfig's
	// Sources), forwarding each one's topic to Kafka exactly once.
	RoleFleet = "fleet"
	// RoleInbox is a Watermill Router reading a Kafka topic as a Kafka
	// consumer group, with the inbox middleware: it records each message
	// it handles in the results table, in the inbox's transaction.
	RoleInbox = "inbox"
)

// ResultsTable is the table (in the outbox schema) where subscriber
// children record every delivery.
const ResultsTable = "chaos_results"

// ResultsDDL creates ResultsTable in schema. The id orders the deliveries
// of a key: a partition has one worker at a time, which records a message
// before it takes the next.
func ResultsDDL(schema string) string {
	return `CREATE TABLE ` + pgx.Identifier{schema, ResultsTable}.Sanitize() + ` (
		id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		grp       text   NOT NULL,
		outbox_id text   NOT NULL,
		uuid      text   NOT NULL,
		key       text   NOT NULL,
		payload   text   NOT NULL,
		attempt   int    NOT NULL,
		pid       int    NOT NULL,
		at        timestamptz NOT NULL DEFAULT clock_timestamp())`
}

// Payload is the body of every message a chaos run publishes.
type Payload struct {
	// ID is the message's UUID, so that every payload is unique.
	ID  string `json:"id"`
	Key string `json:"key"`
	// N is the message's place in its key's order.
	N  int    `json:"n"`
	Tx string `json:"tx"`
	// Poison asks subscribers to reject the message.
	Poison bool `json:"poison,omitempty"`
	// Rollback marks a message whose transaction the publisher meant to
	// roll back: seeing it anywhere is a phantom.
	Rollback bool   `json:"rollback,omitempty"`
	Pad      string `json:"pad,omitempty"`
}

// ErrPoison is the cause subscriber children reject poison messages with.
var ErrPoison = errors.New("chaos: poison message")

// ChildConfig configures a child process.
type ChildConfig struct {
	Role        string
	Name        string
	DatabaseURL string
	Schema      string
	Topic       string
	Group       string
	// Brokers are the Kafka seed brokers of a forwarder or an inbox
	// consumer.
	Brokers []string
	// BrokerMap maps each broker address (the seeds and every address the
	// brokers advertise) to the breakable proxy the child dials instead
	// (kafkatest.ProxyMap's Addrs): the test's broker outages break the
	// proxies. Empty: the brokers are dialed directly.
	BrokerMap map[string]string
	// TransactionalIDPrefix is an exactly-once forwarder's
	// kafka.Config.TransactionalIDPrefix, unique per run so that runs
	// against one cluster never fence each other (default: the target's).
	TransactionalIDPrefix string
	// KafkaGroup is an inbox consumer's Kafka consumer group, unique per
	// run (default: Group).
	KafkaGroup string
	// KafkaTopic is the topic a forwarder writes to (default: Topic) or an
	// inbox consumer reads.
	KafkaTopic string
	// AtLeastOnce turns a forwarder's exactly-once delivery off.
	AtLeastOnce bool
	// Sources are a fleet's databases, by source name (DatabaseURL is
	// then unused).
	Sources map[string]string
	// MaxAttempts is the Subscriber's MaxAttempts.
	MaxAttempts int
	// FlakyRate is the share of deliveries a subscriber nacks on purpose
	// (retried later).
	FlakyRate float64
	// WorkDelay bounds the time a subscriber's handler spends on a message
	// (uniform in [0, WorkDelay)), so that a kill often finds a batch half
	// handled.
	WorkDelay time.Duration
	// LeaseTTL is short, so that takeovers after a kill are quick (the
	// Subscriber renews leases every LeaseTTL/5 and heartbeats every
	// LeaseTTL/10).
	LeaseTTL time.Duration
	Seed     uint64
	// TakeoverTimeout is a relay's relay.Config.TakeoverTimeout: how long a
	// relay that stopped answering keeps the slot from a standby.
	TakeoverTimeout time.Duration
}

// ChildEnv returns the environment entry that hands cfg to a child.
func ChildEnv(cfg ChildConfig) (string, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	return EnvChild + "=" + string(b), nil
}

// ChildFromEnv reads the configuration ChildEnv wrote; ok is false when
// the process is not a child.
func ChildFromEnv() (cfg ChildConfig, ok bool, err error) {
	v := os.Getenv(EnvChild)
	if v == "" {
		return cfg, false, nil
	}
	err = json.Unmarshal([]byte(v), &cfg)
	return cfg, true, err
}

// ErrEndedByItself is returned by RunChild when its subscription or
// forwarder stopped while the process was meant to go on.
var ErrEndedByItself = errors.New("chaos: the subscription ended by itself")

// RunChild plays cfg.Role until ctx ends (then it closes everything and
// returns nil) or its subscription ends by itself (ErrEndedByItself). It
// retries starting while the database is unreachable.
func RunChild(ctx context.Context, cfg ChildConfig) error {
	// Debug logs say what a loss needs explained (a lease's cursor when
	// acquired, a transactional producer's last seq in Kafka after a
	// takeover) at a few lines per takeover; not an inbox consumer's,
	// where watermill-kafka logs every message.
	logger := watermill.NewStdLoggerWithOut(os.Stderr, cfg.Role != RoleInbox, false).With(watermill.LogFields{"child": cfg.Name})
	switch cfg.Role {
	case RoleFleet:
		return runFleet(ctx, cfg, logger)
	case RoleRelay:
		return runRelay(ctx, cfg, logger)
	}
	pool, err := childPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := deadletter.NewStore(deadletter.Config{Schema: cfg.Schema, Pool: pool}, logger)
	if err != nil {
		return err
	}
	tu := childTuning(cfg)
	scfg := outbox.SubscriberConfig{
		Schema:        cfg.Schema,
		Pool:          pool,
		ConsumerGroup: cfg.Group,
		Tuning:        tu,
		RejectHandler: store,
		MaxAttempts:   cfg.MaxAttempts,
		CloseTimeout:  2 * time.Second,
		Advanced:      outbox.Advanced{PollInterval: 200 * time.Millisecond},
	}
	switch cfg.Role {
	case RoleTransactional, RoleLeased:
		if cfg.Role == RoleTransactional {
			scfg.Strategy = outbox.Transactional
		}
		return runSubscriber(ctx, cfg, scfg, pool, logger)
	case RoleForwarder:
		return runForwarder(ctx, cfg, scfg, logger)
	case RoleInbox:
		return runInbox(ctx, cfg, pool, logger)
	}
	return fmt.Errorf("chaos: unknown role %q", cfg.Role)
}

// childPool is a child's pool on the database of url: a dead server is
// noticed within 2 s.
func childPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 12
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// childTuning is every child's adaptive tuning: short backoffs and
// cfg.LeaseTTL, so that a storm's takeovers are quick.
func childTuning(cfg ChildConfig) adaptive.Tuning {
	tu := adaptive.Default()
	tu.BatchSize = 20
	tu.BackoffBase, tu.BackoffMax = 20*time.Millisecond, 500*time.Millisecond
	tu.LeaseTTL = cfg.LeaseTTL
	return tu
}

// retry runs start until it succeeds or ctx ends.
func retry(ctx context.Context, logger watermill.LoggerAdapter, what string, start func() error) error {
	for {
		err := start()
		if err == nil || ctx.Err() != nil {
			return err
		}
		logger.Info("Cannot start yet, retrying", watermill.LogFields{"what": what, "err": err.Error()})
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func runSubscriber(ctx context.Context, cfg ChildConfig, scfg outbox.SubscriberConfig, pool *pgxpool.Pool, logger watermill.LoggerAdapter) error {
	sub, err := outbox.NewSubscriber(scfg, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	var msgs <-chan *message.Message
	if err := retry(ctx, logger, "subscribe", func() (err error) {
		msgs, err = sub.Subscribe(ctx, cfg.Topic)
		return err
	}); err != nil || msgs == nil {
		return err
	}
	insert := `INSERT INTO ` + pgx.Identifier{cfg.Schema, ResultsTable}.Sanitize() + ` (grp, outbox_id, uuid, key, payload, attempt, pid)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(os.Getpid())))
	pid := os.Getpid()
	for msg := range msgs {
		var p Payload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			_ = outbox.Reject(msg, fmt.Errorf("chaos: unreadable payload: %w", err))
			msg.Ack()
			continue
		}
		if p.Poison {
			_ = outbox.Reject(msg, ErrPoison)
			msg.Ack()
			continue
		}
		if rng.Float64() < cfg.FlakyRate {
			msg.Nack()
			continue
		}
		if cfg.WorkDelay > 0 {
			select {
			case <-time.After(time.Duration(rng.Int64N(int64(cfg.WorkDelay)))):
			case <-msg.Context().Done():
			}
		}
		attempt, _ := strconv.Atoi(msg.Metadata.Get(outbox.MetadataAttempt))
		args := []any{cfg.Group, msg.Metadata.Get(outbox.MetadataID), msg.UUID, msg.Metadata.Get(outbox.MetadataPartitionKey), string(msg.Payload), attempt, pid}
		if scfg.Strategy == outbox.Transactional {
			tx, ok := outbox.TxFromContext[pgx.Tx](msg.Context())
			if !ok {
				return errors.New("chaos: a Transactional delivery without its transaction")
			}
			_, err = tx.Exec(msg.Context(), insert, args...)
		} else {
			_, err = pool.Exec(msg.Context(), insert, args...)
		}
		if err != nil {
			msg.Nack()
			continue
		}
		msg.Ack()
	}
	if ctx.Err() != nil {
		return nil
	}
	return ErrEndedByItself
}

func runForwarder(ctx context.Context, cfg ChildConfig, scfg outbox.SubscriberConfig, logger watermill.LoggerAdapter) error {
	target, err := kafka.NewTarget(kafka.Config{
		Brokers: cfg.Brokers, AtLeastOnce: cfg.AtLeastOnce, TransactionalIDPrefix: cfg.TransactionalIDPrefix,
		ClientOptions: forwarderClientOptions(cfg, logger),
	}, logger)
	if err != nil {
		return err
	}
	defer target.Close()
	fcfg := forwarder.Config{Subscriber: scfg, Topics: []string{cfg.Topic}, Target: target}
	if cfg.KafkaTopic != "" {
		fcfg.TargetTopic = func(string) string { return cfg.KafkaTopic }
	}
	fwd, err := forwarder.NewForwarder(fcfg, logger)
	if err != nil {
		return err
	}
	defer func() { _ = fwd.Close() }()
	// Run fails when it cannot join the group (the database is down); a
	// Forwarder runs once, so a new one is made for each try.
	for {
		err := fwd.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			return ErrEndedByItself
		}
		logger.Info("Cannot start yet, retrying", watermill.LogFields{"what": "forwarder", "err": err.Error()})
		_ = fwd.Close()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
		if fwd, err = forwarder.NewForwarder(fcfg, logger); err != nil {
			return err
		}
	}
}

// runRelay runs what `outbox pipeline --wal` runs on cfg's schema (the
// schema's sequencer and the relay of its slot, under the instance name
// cfg.Name, with cfg.TakeoverTimeout), without retention, until ctx ends.
// The relay retries what it can mend (the database down, the slot
// streamed by another relay) by itself; an error Run returns is one it
// cannot mend, and ends the process.
func runRelay(ctx context.Context, cfg ChildConfig, logger watermill.LoggerAdapter) error {
	pool, err := childPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	p, err := pipeline.New(pipeline.Config{
		Schema: cfg.Schema, Pool: pool,
		WAL:              &relay.Config{TakeoverTimeout: cfg.TakeoverTimeout, Instance: cfg.Name},
		DisableRetention: true,
	}, logger)
	if err != nil {
		return err
	}
	defer func() { _ = p.Close() }()
	if err := p.Run(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return ErrEndedByItself
	}
	return nil
}

// runFleet runs a pipeline.Fleet over cfg.Sources (each database's
// sequencer, forwarder and retention) into cfg.KafkaTopic, exactly once.
// A database that is down, at the start or later, is the fleet's to
// retry: the process never exits for it.
func runFleet(ctx context.Context, cfg ChildConfig, logger watermill.LoggerAdapter) error {
	target, err := kafka.NewTarget(kafka.Config{
		Brokers: cfg.Brokers, TransactionalIDPrefix: cfg.TransactionalIDPrefix,
		ClientOptions: forwarderClientOptions(cfg, logger),
	}, logger)
	if err != nil {
		return err
	}
	defer target.Close()
	tu := childTuning(cfg)
	fc := pipeline.FleetConfig{
		Pipeline: pipeline.Config{Forward: forwarder.Config{
			Subscriber: outbox.SubscriberConfig{ConsumerGroup: cfg.Group, Tuning: tu, CloseTimeout: 2 * time.Second,
				Advanced: outbox.Advanced{PollInterval: 200 * time.Millisecond}},
			Topics:      []string{cfg.Topic},
			Target:      target,
			TargetTopic: func(string) string { return cfg.KafkaTopic },
		}},
		CheckInterval:  500 * time.Millisecond,
		RestartBackoff: time.Second,
	}
	for name, url := range cfg.Sources {
		pool, err := childPool(ctx, url)
		if err != nil {
			return err
		}
		defer pool.Close()
		fc.Sources = append(fc.Sources, pipeline.Source{Name: name, Pool: pool, Schema: cfg.Schema})
	}
	fleet, err := pipeline.NewFleet(fc, logger)
	if err != nil {
		return err
	}
	if err := fleet.Run(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return ErrEndedByItself
	}
	return nil
}

// runInbox consumes cfg.KafkaTopic as Kafka consumer group cfg.KafkaGroup
// through watermill-kafka and a Router with the inbox middleware (inbox
// consumer cfg.Group); the handler records each message in the results
// table in the inbox's transaction, after up to WorkDelay, so that a kill
// often lands between a handled message and the consumer's offset commit
// (a redelivery) or in the middle of a handler (a rollback).
func runInbox(ctx context.Context, cfg ChildConfig, pool *pgxpool.Pool, logger watermill.LoggerAdapter) error {
	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: cfg.Group})
	if err != nil {
		return err
	}
	sc := inboxSaramaConfig(cfg, logger)
	group := cfg.KafkaGroup
	if group == "" {
		group = cfg.Group
	}
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers: cfg.Brokers, Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
		ConsumerGroup: group, ReconnectRetrySleep: 200 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 2 * time.Second}, logger)
	if err != nil {
		return err
	}
	insert := `INSERT INTO ` + pgx.Identifier{cfg.Schema, ResultsTable}.Sanitize() + ` (grp, outbox_id, uuid, key, payload, attempt, pid)
		VALUES ($1, $2, $3, $4, $5, 0, $6)`
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(os.Getpid())))
	var rngMu sync.Mutex
	pid := os.Getpid()
	router.AddMiddleware(in.Middleware)
	router.AddConsumerHandler("inbox", cfg.KafkaTopic, sub, func(msg *message.Message) error {
		tx, ok := outbox.TxFromContext[pgx.Tx](msg.Context())
		if !ok {
			return errors.New("chaos: the inbox middleware gave the handler no transaction")
		}
		if cfg.WorkDelay > 0 {
			rngMu.Lock()
			d := time.Duration(rng.Int64N(int64(cfg.WorkDelay)))
			rngMu.Unlock()
			time.Sleep(d)
		}
		_, err := tx.Exec(msg.Context(), insert, cfg.Group, msg.Metadata.Get(outbox.MetadataID), msg.UUID,
			msg.Metadata.Get(outbox.MetadataPartitionKey), string(msg.Payload), pid)
		return err
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case err := <-done:
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		return ErrEndedByItself
	case <-ctx.Done():
		_ = router.Close()
		<-done
		return nil
	}
}

// forwarderClientOptions are the franz-go options of a forwarder child's
// target (every client it makes): through cfg.BrokerMap when there is one.
func forwarderClientOptions(cfg ChildConfig, logger watermill.LoggerAdapter) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.ClientID(cfg.Name),
		kgo.DialTimeout(time.Second),
		kgo.RequestTimeoutOverhead(2 * time.Second),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
	}
	if d := brokerDialer(cfg, logger); d != nil {
		opts = append(opts, d.Option())
	}
	return opts
}

// inboxSaramaConfig is the sarama configuration of an inbox child's
// watermill-kafka subscriber: through cfg.BrokerMap when there is one.
func inboxSaramaConfig(cfg ChildConfig, logger watermill.LoggerAdapter) *sarama.Config {
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.ClientID = cfg.Name
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Group.Session.Timeout = 6 * time.Second
	sc.Consumer.Group.Heartbeat.Interval = time.Second
	sc.Consumer.Group.Rebalance.Timeout = 6 * time.Second
	sc.Consumer.Offsets.AutoCommit.Interval = 500 * time.Millisecond
	sc.Net.DialTimeout = time.Second
	if d := brokerDialer(cfg, logger); d != nil {
		d.ConfigureSarama(sc)
	}
	return sc
}

// brokerDialer dials the brokers through cfg.BrokerMap (nil without one,
// a dial timeout of a second); an address the map lacks is refused and
// logged once.
func brokerDialer(cfg ChildConfig, logger watermill.LoggerAdapter) *kafkatest.MapDialer {
	if len(cfg.BrokerMap) == 0 {
		return nil
	}
	return &kafkatest.MapDialer{
		Addrs:   cfg.BrokerMap,
		Timeout: time.Second,
		OnUnmapped: func(addr string) {
			logger.Error("A broker address has no proxy: not dialed (a broker that joined the cluster after the run started?)",
				kafkatest.ErrUnmapped, watermill.LogFields{"addr": addr})
		},
	}
}
