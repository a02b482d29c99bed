package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/warnlog"
)

// ErrNoSuchTopic is what CheckTopic (so Forwarder.Run) returns, wrapped
// with the topic and what to do, for a destination Kafka topic that does
// not exist while Config.CreateTopics is off. (An outbox topic that is not
// registered is outbox.ErrUnknownTopic.)
var ErrNoSuchTopic = errors.New("kafka: the topic does not exist")

// topicCheckTimeout bounds CheckTopic's requests: an unreachable cluster
// must not keep a forwarder from starting.
const topicCheckTimeout = 10 * time.Second

var _ forwarder.TopicChecker = (*Target)(nil)

// CheckTopic implements forwarder.TopicChecker; the Forwarder calls it
// for every outbox topic as it starts. A topic that does not exist is
// ErrNoSuchTopic (sends to it would only be retried), or is created with
// outboxPartitions partitions and the brokers' default replication factor
// when Config.CreateTopics is set; with outboxPartitions 0 (the outbox
// topic is not registered) it is not created but refused, with an error
// matching outbox.ErrUnknownTopic. A topic whose
// partition count differs from the outbox topic's is forwarded (each
// record goes to the Kafka partition of its key, which keeps the order per
// key) with a warning: exactly-once takeovers then read further back to
// find what the partition's previous owner wrote (Config.TailScanLimit),
// where equal counts read only the last record. A cluster it cannot reach
// or ask is logged and not an error: the forwarder starts and its sends
// are retried.
func (t *Target) CheckTopic(ctx context.Context, topic string, outboxPartitions int) error {
	if t == nil || t.producers == nil {
		return errs.NotConstructed("kafka.Target", "kafka.NewTarget")
	}
	if ctx == nil {
		return errs.NilArgument("kafka.Target.CheckTopic", "pass a context")
	}
	driver, err := t.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, topicCheckTimeout)
	defer cancel()
	fields := watermill.LogFields{"topic": topic, "outbox_partitions": outboxPartitions}
	n, exists, err := driver.TopicPartitions(ctx, topic)
	if err != nil {
		t.logger.Info("Cannot check the Kafka topic at start: the forwarder starts, and its sends are retried", fields.Add(watermill.LogFields{"err": err.Error()}))
		return nil
	}
	if !exists {
		return t.createTopic(ctx, driver, topic, outboxPartitions, fields)
	}
	if outboxPartitions > 0 && n != outboxPartitions {
		warnlog.Warn("The Kafka topic's partition count differs from the outbox topic's: records go to the partition of their key (order per key holds), but an exactly-once takeover reads further back than with equal counts; give both topics the same count where you can",
			fields.Add(watermill.LogFields{"kafka_partitions": n}), t.logger)
	}
	return nil
}

// createTopic creates topic when Config.CreateTopics allows it.
func (t *Target) createTopic(ctx context.Context, driver kafkadriver.Driver, topic string, outboxPartitions int, fields watermill.LogFields) error {
	partitions := max(outboxPartitions, 1)
	if t.cfg.CreateTopics && outboxPartitions <= 0 {
		// Created now, it would have 1 partition for good, whatever the
		// outbox topic is registered with later.
		return fmt.Errorf("%w: the outbox topic forwarded to Kafka topic %q is not registered (or its database could not be read at start), so the forwarder does not know how many partitions to create it with: register it first (outbox.RegisterTopic, or outbox topics register TOPIC PARTITIONS), then start the forwarder",
			sentinel.ErrUnknownTopic, topic)
	}
	if !t.cfg.CreateTopics {
		return fmt.Errorf("%w: %q: create it with %d partitions (as many as the outbox topic; e.g. kafka-topics.sh --create --topic %s --partitions %d), or set kafka.Config.CreateTopics to let the forwarder create it",
			ErrNoSuchTopic, topic, partitions, topic, partitions)
	}
	err := driver.CreateTopic(ctx, topic, partitions)
	switch {
	case err == nil:
		t.logger.Info("Created the Kafka topic", fields.Add(watermill.LogFields{"kafka_partitions": partitions}))
	case errors.Is(err, kerr.TopicAlreadyExists): // another instance was first
	default:
		return fmt.Errorf("kafka: create topic %q with %d partitions (kafka.Config.CreateTopics): %w", topic, partitions, err)
	}
	// The brokers answer a create before every one of them knows the
	// topic: a send right after it fails with UNKNOWN_TOPIC_OR_PARTITION
	// (retried, but logged). Wait until the metadata shows every
	// partition, as long as the check may take.
	for {
		if n, exists, err := driver.TopicPartitions(ctx, topic); err == nil && exists && n >= partitions {
			return nil
		}
		select {
		case <-ctx.Done():
			t.logger.Info("The created Kafka topic's metadata did not show all its partitions in time: the first sends may be retried", fields)
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}
