package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/internal/ceiling"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/relay"
)

// outboxTopic is the topic name inside each system's schema.
const outboxTopic = "bench"

// system is one way of publishing (and relaying) set up for one run, in a
// schema of its own. The relay does not run until start.
type system struct {
	// publish writes one transaction's messages with tx.
	publish func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
	// kafkaTopic is where the relay delivers; "" for the ceiling.
	kafkaTopic string
	// start starts the relay (nil for the ceiling); it returns once the
	// relay runs, or with its error.
	start func(ctx context.Context) error
	// stop stops the relay if it was started and releases everything.
	stop func()
}

// outboxOptions are what the runs of (c) vary.
type outboxOptions struct {
	partitions  int
	tuning      adaptive.Tuning
	atLeastOnce bool
	// wal: the log-based mode (e).
	wal bool
}

// setup creates system name in schema, relaying to kafkaTopic on brokers.
// opts apply to (c) only.
func (b *bench) setup(ctx context.Context, name, schema, kafkaTopic string, brokers []string, opts outboxOptions) (*system, error) {
	switch name {
	case sysCeiling:
		return b.setupCeiling(ctx, schema)
	case sysPeer:
		return b.setupPeer(ctx, schema, kafkaTopic, brokers, false)
	case sysPeerTuned:
		return b.setupPeer(ctx, schema, kafkaTopic, brokers, true)
	case sysOutbox:
		return b.setupOutbox(ctx, schema, kafkaTopic, brokers, opts)
	case sysOutboxALO:
		opts.atLeastOnce = true
		return b.setupOutbox(ctx, schema, kafkaTopic, brokers, opts)
	case sysOutboxWAL:
		opts.wal = true
		return b.setupOutbox(ctx, schema, kafkaTopic, brokers, opts)
	case sysRiver:
		return b.setupRiver(ctx, schema, kafkaTopic, brokers)
	}
	return nil, fmt.Errorf("unknown system %q", name)
}

// setupCeiling creates (a): a bare table with the columns of the outbox's
// pending table, no identity, no index, written with one multi-row INSERT
// per transaction. Messages become rows the way an application would do it
// (murmur2 partition, metadata as JSON), as in bench/publish_bench_test.go.
func (b *bench) setupCeiling(ctx context.Context, schema string) (*system, error) {
	if _, err := b.admin.Exec(ctx, sqlFor(schema, `CREATE TABLE {{s}}.plain (
		uuid          text        NOT NULL,
		metadata      jsonb       NOT NULL,
		payload       bytea       NOT NULL,
		partition_key text,
		topic         text        NOT NULL,
		partition     integer     NOT NULL,
		created_at    timestamptz NOT NULL DEFAULT now()
	)`)); err != nil {
		return nil, err
	}
	insert := sqlFor(schema, "INSERT INTO {{s}}.plain "+ceiling.InsertColumns)
	return &system{publish: ceiling.PlainInsert(insert, outboxTopic, b.cfg.partitions), stop: func() {}}, nil
}

// setupPeer creates (b), as watermill-sql and Watermill's docs show it:
// in each transaction a watermill-sql Publisher (DefaultPostgreSQLSchema)
// over the transaction, decorated by components/forwarder's Publisher, which
// wraps each message in an envelope naming its destination topic and
// writes it to the forwarder topic's table. The relay, once started: a
// components/forwarder Forwarder that reads that table with a watermill-sql
// Subscriber (DefaultPostgreSQLOffsetsAdapter, PollInterval 100 ms) and
// publishes each message with watermill-kafka's publisher (a sarama
// SyncProducer), keyed by the partition key. The forwarder unwraps the
// envelope with the message's metadata, which watermill-kafka's marshaler
// puts into record headers.
//
// tuned, (b'), goes as far as watermill-sql's own options go for a single
// relay: the queue schema adapter (PostgreSQLQueueSchema, no consumer
// groups, which a forwarder table does not need) with DeleteOnAck, so that
// the table stays small, batches of 1,000 (SubscribeBatchSize, default 100)
// and a 10 ms PollInterval.
func (b *bench) setupPeer(ctx context.Context, schema, kafkaTopic string, brokers []string, tuned bool) (*system, error) {
	table := func(topic string) string { return pgx.Identifier{schema, "watermill_" + topic}.Sanitize() }
	var (
		schemaAdapter  wsql.SchemaAdapter  = wsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: table}
		offsetsAdapter wsql.OffsetsAdapter = wsql.DefaultPostgreSQLOffsetsAdapter{
			GenerateMessagesOffsetsTableName: func(topic string) string {
				return pgx.Identifier{schema, "watermill_offsets_" + topic}.Sanitize()
			},
		}
		group = "bench"
		// The default is 1 s; 100 ms keeps the wait after an empty poll
		// from dominating small runs.
		poll = 100 * time.Millisecond
	)
	if tuned {
		schemaAdapter = wsql.PostgreSQLQueueSchema{GenerateMessagesTableName: table, SubscribeBatchSize: 1000}
		offsetsAdapter = wsql.PostgreSQLQueueOffsetsAdapter{GenerateMessagesTableName: table, DeleteOnAck: true}
		group, poll = "", 10*time.Millisecond
	}
	fwdTopic := "forwarder_" + schema
	relayPool, err := b.pool(ctx, 4)
	if err != nil {
		return nil, err
	}
	logger := watermill.NopLogger{}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(relayPool), wsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   offsetsAdapter,
		InitializeSchema: true,
		PollInterval:     poll,
	}, logger)
	if err != nil {
		relayPool.Close()
		return nil, err
	}
	// Creates the tables, so that publishing can start before the relay.
	if err := sub.SubscribeInitialize(fwdTopic); err != nil {
		_ = sub.Close()
		relayPool.Close()
		return nil, err
	}
	var (
		kpub    message.Publisher
		fwd     *wforwarder.Forwarder
		done    chan error
		started bool
	)
	sys := &system{kafkaTopic: kafkaTopic}
	sys.start = func(context.Context) error {
		kp, err := newKafkaPublisher(brokers)
		if err != nil {
			return err
		}
		kpub = kp
		fwd, err = wforwarder.NewForwarder(sub, kpub, logger, wforwarder.Config{ForwarderTopic: fwdTopic, CloseTimeout: 5 * time.Second})
		if err != nil {
			return err
		}
		done = make(chan error, 1)
		started = true
		go func() { done <- fwd.Run(context.Background()) }()
		select {
		case <-fwd.Running():
			return nil
		case err := <-done:
			done <- err
			return fmt.Errorf("watermill forwarder: %w", err)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("watermill forwarder did not start")
		}
	}
	sys.stop = func() {
		if started {
			_ = fwd.Close()
			<-done
		}
		// The router closes the subscriber it ran; closing again is harmless.
		_ = sub.Close()
		if kpub != nil {
			_ = kpub.Close()
		}
		relayPool.Close()
	}
	fcfg := wforwarder.PublisherConfig{ForwarderTopic: fwdTopic}
	sys.publish = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schemaAdapter}, logger)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			m.SetContext(ctx)
		}
		return wforwarder.NewPublisher(pub, fcfg).Publish(kafkaTopic, msgs...)
	}
	return sys, nil
}

// newKafkaPublisher is the Kafka producer of the peers: watermill-kafka's
// publisher (a sarama SyncProducer), keyed by the partition key.
func newKafkaPublisher(brokers []string) (message.Publisher, error) {
	return wmkafka.NewPublisher(wmkafka.PublisherConfig{
		Brokers: brokers,
		Marshaler: wmkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(outbox.PublishPartitionKeyMetadata), nil
		}),
	}, watermill.NopLogger{})
}

// setupOutbox creates (c): Migrate into the schema, register the topic
// with opts.partitions partitions, and a long-lived context-bound
// outbox.Publisher (NOTIFY on unless -outbox-notify=false). The relay, once
// started: a forwarder.Forwarder (its Subscriber runs the Sequencer, the
// default) with a kafka.Target (its defaults) and opts.tuning, on a
// pool of its own as in cmd/outbox-demo.
func (b *bench) setupOutbox(ctx context.Context, schema, kafkaTopic string, brokers []string, opts outboxOptions) (*system, error) {
	admin, err := b.pool(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := outbox.Migrate(ctx, admin, schema); err != nil {
		return nil, err
	}
	var topicOpts []outbox.TopicOption
	if b.cfg.forwardOnly {
		topicOpts = append(topicOpts, outbox.ForwardOnly())
	}
	if err := outbox.RegisterTopic(ctx, admin, schema, outboxTopic, opts.partitions, topicOpts...); err != nil {
		return nil, err
	}
	mode := outbox.ModeTable
	if opts.wal {
		mode = outbox.ModeWAL
		if err := relay.CreateSlot(ctx, admin, schema); err != nil {
			return nil, err
		}
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DisableNotify: !b.cfg.outboxNotify, Mode: mode}, nil)
	if err != nil {
		return nil, err
	}
	var (
		relayPool *pgxpool.Pool
		target    *kafka.Target
		fwd       *forwarder.Forwarder
		done      chan error
		walRelay  *relay.Relay
		walDone   chan error
	)
	sys := &system{kafkaTopic: kafkaTopic}
	sys.start = func(ctx context.Context) error {
		var err error
		// The bulkhead (the profile's) plus a few connections.
		bulkhead, _ := tune.Lookup(opts.tuning.ProfileName())
		if relayPool, err = b.pool(ctx, bulkhead.MaxConcurrentPartitions+4); err != nil {
			return err
		}
		if target, err = kafka.NewTarget(kafka.Config{Brokers: brokers, AtLeastOnce: opts.atLeastOnce}, nil); err != nil {
			return err
		}
		fwd, err = forwarder.NewForwarder(forwarder.Config{
			Subscriber: outbox.SubscriberConfig{
				Schema:       schema,
				Pool:         relayPool,
				Tuning:       opts.tuning,
				CloseTimeout: 5 * time.Second,
				// (e): the relay appends to the log; nothing is pending.
				DisableSequencer: opts.wal,
			},
			Topics:      []string{outboxTopic},
			Target:      target,
			TargetTopic: func(string) string { return kafkaTopic },
		}, nil)
		if err != nil {
			return err
		}
		done = make(chan error, 1)
		go func() { done <- fwd.Run(context.Background()) }()
		if opts.wal {
			// The relay at the pace that matches the forwarder's profile,
			// as the table mode's sequencer is (unless -relay-pace).
			pace := b.cfg.relayPace
			if pace == 0 {
				pace = opts.tuning.AppendInterval()
			}
			if walRelay, err = relay.New(relay.Config{Schema: schema, Pool: relayPool, MinAppendInterval: pace}, nil); err != nil {
				return err
			}
			walDone = make(chan error, 1)
			go func() { walDone <- walRelay.Run(context.Background()) }()
		}
		return nil
	}
	sys.stop = func() {
		if walRelay != nil {
			_ = walRelay.Close()
			<-walDone
		}
		if opts.wal {
			// The slot keeps WAL until dropped.
			if p, err := b.pool(context.Background(), 1); err == nil {
				if err := relay.DropSlot(context.Background(), p, schema, true); err != nil {
					logf("warning: drop the slot of %s: %v", schema, err)
				}
				p.Close()
			}
		}
		if fwd != nil {
			_ = fwd.Close()
			<-done
			if st := fwd.Stats(); st.Batches > 0 {
				logf("forwarder: %d messages in %d batches (%.1f per batch), %d failures", st.Messages, st.Batches, float64(st.Messages)/float64(st.Batches), st.Failures)
			}
		}
		if target != nil {
			_ = target.Close()
		}
		if relayPool != nil {
			relayPool.Close()
		}
	}
	sys.publish = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		txCtx := outbox.WithTx(ctx, tx)
		for _, m := range msgs {
			m.SetContext(txCtx)
		}
		return pub.Publish(outboxTopic, msgs...)
	}
	return sys, nil
}
