package kafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// missingTopic is a topic name no test created, deleted at the end if the
// test made it exist.
func missingTopic(t *testing.T, c *kafkatest.Cluster) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "missing-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.Admin().DeleteTopic(ctx, name)
	})
	return name
}

func runForwarder(t *testing.T, e fwdtest.Env, target forwarder.Target, topic, kafkaTopic string) (*forwarder.Forwarder, chan error) {
	t.Helper()
	return runForwarderLogged(t, e, target, topic, kafkaTopic, nil)
}

func runForwarderLogged(t *testing.T, e fwdtest.Env, target forwarder.Target, topic, kafkaTopic string, logger watermill.LoggerAdapter) (*forwarder.Forwarder, chan error) {
	t.Helper()
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, Tuning: outboxtest.FastTuning(),
			Advanced: outboxtest.FastAdvanced(), RejectHandler: e.DeadLetters(), CloseTimeout: time.Second},
		Topics:      []string{topic},
		Target:      target,
		TargetTopic: func(string) string { return kafkaTopic },
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- fwd.Run(context.Background()) }()
	t.Cleanup(func() { _ = fwd.Close() })
	return fwd, ran
}

// A destination topic that does not exist stops Run at start with
// ErrUnknownTopic, saying what to create, instead of retrying sends for
// ever.
func TestForwarderRefusesAMissingKafkaTopicAtStart(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 6)
	c := kafkatest.New(t)
	topic := missingTopic(t, c)
	_, ran := runForwarder(t, e, newTargetWith(t, kafka.Config{Brokers: c.Brokers}), "orders", topic)
	select {
	case err := <-ran:
		if !errors.Is(err, kafka.ErrNoSuchTopic) || !strings.Contains(err.Error(), "create it with 6 partitions") || !strings.Contains(err.Error(), "CreateTopics") {
			t.Fatalf("Run: %v, want ErrUnknownTopic saying to create it with 6 partitions or set CreateTopics", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run kept running with a destination topic that does not exist")
	}
}

// With CreateTopics the forwarder creates the missing topic with as many
// partitions as the outbox topic, and forwards into it; it waits for the
// topic's metadata first, so that no first send fails (and is logged) with
// UNKNOWN_TOPIC_OR_PARTITION, as the quick start's did.
func TestForwarderCreatesTheMissingKafkaTopicWhenAsked(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 6)
	c := kafkatest.New(t)
	topic := missingTopic(t, c)
	logs := watermill.NewCaptureLogger()
	fwd, _ := runForwarderLogged(t, e, newTargetWith(t, kafka.Config{Brokers: c.Brokers, CreateTopics: true}), "orders", topic, logs)
	pub := fwdtest.NewPublisher(t, e)
	pub.Round("orders", 20, nil)
	outboxtest.WaitFor(t, "the messages forwarded", time.Minute, func() bool { return fwd.Stats().Messages >= 20 }) // a batch confirmed again after a failed cursor write counts twice
	md, err := c.Admin().ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := md[topic]; !ok || d.Err != nil || len(d.Partitions) != 6 {
		t.Fatalf("topic %s after the forwarder started: %+v, want 6 partitions", topic, md[topic])
	}
	if got := len(c.ReadCommitted(t, topic)); got != 20 {
		t.Fatalf("%d records in the created topic, want 20", got)
	}
	for _, entries := range logs.Captured() {
		for _, l := range entries {
			if strings.Contains(fmt.Sprint(l.Fields["err"], l.Err), "UNKNOWN_TOPIC_OR_PARTITION") {
				t.Errorf("a send into the topic just created failed: %s %v %v", l.Msg, l.Err, l.Fields["err"])
			}
		}
	}
}

// With CreateTopics, an outbox topic that is not registered is refused
// (ErrUnknownTopic, saying to register it) instead of a Kafka topic created
// with 1 partition for good.
func TestForwarderDoesNotCreateAKafkaTopicForAnUnregisteredOutboxTopic(t *testing.T) {
	e := fwdtest.NewEnv(t)
	c := kafkatest.New(t)
	topic := missingTopic(t, c)
	_, ran := runForwarder(t, e, newTargetWith(t, kafka.Config{Brokers: c.Brokers, CreateTopics: true}), "orders", topic)
	select {
	case err := <-ran:
		if !errors.Is(err, outbox.ErrUnknownTopic) || !strings.Contains(err.Error(), "register it first") {
			t.Fatalf("Run: %v, want ErrUnknownTopic saying to register the outbox topic first", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run kept running with an outbox topic that is not registered")
	}
	md, err := c.Admin().ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := md[topic]; ok && d.Err == nil {
		t.Fatalf("the Kafka topic %s was created (%d partitions) for an unregistered outbox topic", topic, len(d.Partitions))
	}
}

// A destination topic with another partition count is forwarded into,
// with a warning at start that says what it costs.
func TestForwarderWarnsOfUnequalPartitionCounts(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 6)
	c := kafkatest.New(t)
	topic := c.Topic(t, "unequal", 4, nil)
	logs := watermill.NewCaptureLogger()
	target, err := kafka.NewTarget(kafka.Config{Brokers: c.Brokers}, logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	fwd, _ := runForwarder(t, e, target, "orders", topic)
	pub := fwdtest.NewPublisher(t, e)
	pub.Round("orders", 20, nil)
	outboxtest.WaitFor(t, "the messages forwarded", time.Minute, func() bool { return fwd.Stats().Messages >= 20 }) // a batch confirmed again after a failed cursor write counts twice
	warned := false
	for _, entries := range logs.Captured() {
		for _, l := range entries {
			if strings.Contains(l.Msg, "partition count differs") && l.Fields["kafka_partitions"] == 4 && l.Fields["outbox_partitions"] == 6 {
				warned = true
			}
		}
	}
	if !warned {
		t.Fatalf("no warning about 4 Kafka partitions for 6 outbox partitions; logged: %+v", logs.Captured())
	}
}
