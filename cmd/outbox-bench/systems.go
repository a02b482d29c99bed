package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/ceiling"
)

// outboxTopic is the topic name inside each system's schema.
const outboxTopic = "bench"

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
	return &system{publish: ceiling.PlainInsert(insert, outboxTopic, b.cfg.partitions)}, nil
}

// setupPeer creates (b), as watermill-sql and Watermill's docs show it:
// in each transaction a watermill-sql Publisher (DefaultPostgreSQLSchema)
// over the transaction, decorated by components/forwarder's Publisher, which
// wraps each message in an envelope naming its destination topic and
// writes it to the forwarder topic's table. A components/forwarder
// Forwarder reads that table with a watermill-sql Subscriber
// (DefaultPostgreSQLOffsetsAdapter) and publishes each message with
// watermill-kafka's publisher (a sarama SyncProducer), keyed by the
// partition key.
func (b *bench) setupPeer(ctx context.Context, schema, kafkaTopic string) (*system, error) {
	schemaAdapter := wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string {
			return pgx.Identifier{schema, "watermill_" + topic}.Sanitize()
		},
	}
	offsetsAdapter := wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return pgx.Identifier{schema, "watermill_offsets_" + topic}.Sanitize()
		},
	}
	fwdTopic := "forwarder_" + schema
	relayPool, err := b.pool(ctx, 4)
	if err != nil {
		return nil, err
	}
	logger := watermill.NopLogger{}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(relayPool), wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   offsetsAdapter,
		InitializeSchema: true,
		// The default is 1 s; 100 ms keeps the wait after an empty poll
		// from dominating small runs.
		PollInterval: 100 * time.Millisecond,
	}, logger)
	if err != nil {
		relayPool.Close()
		return nil, err
	}
	if err := sub.SubscribeInitialize(fwdTopic); err != nil {
		relayPool.Close()
		return nil, err
	}
	kpub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: b.brokers,
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(outbox.PartitionKeyMetadata), nil
		}),
	}, logger)
	if err != nil {
		relayPool.Close()
		return nil, err
	}
	fwd, err := wforwarder.NewForwarder(sub, kpub, logger, wforwarder.Config{ForwarderTopic: fwdTopic, CloseTimeout: 5 * time.Second})
	if err != nil {
		relayPool.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(context.Background()) }()
	select {
	case <-fwd.Running():
	case err := <-done:
		relayPool.Close()
		return nil, fmt.Errorf("watermill forwarder: %w", err)
	case <-time.After(30 * time.Second):
		relayPool.Close()
		return nil, fmt.Errorf("watermill forwarder did not start")
	}
	fcfg := wforwarder.PublisherConfig{ForwarderTopic: fwdTopic}
	return &system{
		kafkaTopic: kafkaTopic,
		publish: func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schemaAdapter}, logger)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				m.SetContext(ctx)
			}
			return wforwarder.NewPublisher(pub, fcfg).Publish(kafkaTopic, msgs...)
		},
		stop: func() {
			_ = fwd.Close()
			<-done
			_ = kpub.Close()
			relayPool.Close()
		},
	}, nil
}

// setupOutbox creates (c): Migrate into the schema, register the topic, a
// long-lived context-bound outbox.Publisher (NOTIFY on, the default), and a
// forwarder.Forwarder (its Subscriber runs the Sequencer, the default) with
// a KafkaTarget (DefaultSaramaConfig), all with default tuning, on a pool of
// its own as in cmd/outbox-demo.
func (b *bench) setupOutbox(ctx context.Context, schema, kafkaTopic string) (*system, error) {
	admin, err := b.pool(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := outbox.Migrate(ctx, admin, schema); err != nil {
		return nil, err
	}
	if err := outbox.RegisterTopic(ctx, admin, schema, outboxTopic, b.cfg.partitions); err != nil {
		return nil, err
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DisableNotify: !b.cfg.outboxNotify}, nil)
	if err != nil {
		return nil, err
	}
	tuning := adaptive.Default()
	relayPool, err := b.pool(ctx, tuning.MaxConcurrentPartitions+4)
	if err != nil {
		return nil, err
	}
	target, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: b.brokers})
	if err != nil {
		relayPool.Close()
		return nil, err
	}
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{
			Schema:       schema,
			Pool:         relayPool,
			Tuning:       tuning,
			CloseTimeout: 5 * time.Second,
		},
		Topics:      []string{outboxTopic},
		Target:      target,
		TargetTopic: func(string) string { return kafkaTopic },
	}, nil)
	if err != nil {
		_ = target.Close()
		relayPool.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(context.Background()) }()
	return &system{
		kafkaTopic: kafkaTopic,
		publish: func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			txCtx := outbox.WithTx(ctx, tx)
			for _, m := range msgs {
				m.SetContext(txCtx)
			}
			return pub.Publish(outboxTopic, msgs...)
		},
		stop: func() {
			_ = fwd.Close()
			<-done
			_ = target.Close()
			relayPool.Close()
		},
	}, nil
}
