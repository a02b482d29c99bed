package kafka_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/kafkaseam"
	"github.com/millrace/watermill-outbox/internal/origin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Two databases of a sharded application number their messages alike:
// the same schema, consumer group, topic and partition, seqs from 1. Sent
// exactly once into one Kafka topic as named sources, neither fences the
// other's producer, and neither takes the other's records for its own
// when it reads the tail back.

// fromSource returns batch as source's forwarder sends it: seqs from
// first (as its database numbered them), metadata outbox_source set.
func fromSource(source string, first int64, batch []*message.Message) []*message.Message {
	for i, m := range batch {
		seq := first + int64(i)
		m.Metadata.Set(outbox.MetadataSeq, strconv.FormatInt(seq, 10))
		m.Metadata.Set(outbox.MetadataID, outbox.StableID("orders", 0, seq))
		m.Metadata.Set(outbox.MetadataSource, source)
		m.Metadata.Set("source", source)
	}
	return batch
}

// sendAs sends batch through target as a Forwarder of source does: with
// its origin given explicitly (internal/forward.Direct).
func sendAs(ctx context.Context, target *kafka.Target, source, topic string, batch []*message.Message) (int, error) {
	from := origin.Origin{Source: source, Schema: "shop_outbox", Group: "outbox-forwarder", Partitions: 1}
	return forward.Direct(target)(ctx, from, topic, batch)
}

// bySource counts the committed records of topic by source, each id once,
// and fails the test on a record sent twice.
func bySource(t *testing.T, c *kafkatest.Cluster, topic string) map[string]int {
	t.Helper()
	out := map[string]int{}
	seen := map[string]bool{}
	for _, r := range c.ReadCommitted(t, topic) {
		src := kafkatest.Header(r, outbox.MetadataSource)
		if src != kafkatest.Header(r, "source") {
			t.Fatalf("record %s of source %q carries outbox_source %q", kafkatest.Header(r, outbox.MetadataID), kafkatest.Header(r, "source"), src)
		}
		id := src + "|" + kafkatest.Header(r, outbox.MetadataID)
		if seen[id] {
			t.Fatalf("record %s twice", id)
		}
		seen[id] = true
		out[src]++
	}
	return out
}

// A source that starts after another wrote seqs 1-10 still writes its own
// 1-5 (its tail read finds none of its records), and a takeover of it skips
// what it wrote (its tail read finds its own).
func TestEachSourceReadsBackOnlyItsOwnRecords(t *testing.T) {
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 1, nil)
	eu := fromSource("eu", 1, fwdtest.OutboxBatch(10, fwdtest.SameKey))
	if done, err := sendAs(outboxtest.Ctx(t), newTarget(t, c, false), "eu", topic, eu); done != 10 || err != nil {
		t.Fatalf("eu: %d of 10, %v", done, err)
	}
	us := fromSource("us", 1, fwdtest.OutboxBatch(5, fwdtest.SameKey))
	if done, err := sendAs(outboxtest.Ctx(t), newTarget(t, c, false), "us", topic, us); done != 5 || err != nil {
		t.Fatalf("us: %d of 5, %v", done, err)
	}
	if got := bySource(t, c, topic); got["eu"] != 10 || got["us"] != 5 {
		t.Fatalf("records by source: %v, want eu 10, us 5", got)
	}
	// us's partition changes hands before its cursor moved: the new owner
	// gets the batch again and finds it in the tail, as its own.
	again := fromSource("us", 1, fwdtest.OutboxBatch(5, fwdtest.SameKey))
	if done, err := sendAs(outboxtest.Ctx(t), newTarget(t, c, false), "us", topic, again); done != 5 || err != nil {
		t.Fatalf("us after a takeover: %d of 5, %v", done, err)
	}
	if got := bySource(t, c, topic); got["eu"] != 10 || got["us"] != 5 {
		t.Fatalf("records by source after us's takeover: %v, want eu 10, us 5", got)
	}
}

// eu's transaction is open when us (another process) starts sending the
// same schema, group, topic and partition: us's InitProducerId must not
// fence eu, whose commit goes through.
func TestSourcesDoNotFenceEachOther(t *testing.T) {
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 1, nil)
	frozen, wake := make(chan struct{}), make(chan struct{})
	paused := kafkaseam.With(outboxtest.Ctx(t), kafkaseam.Seams{BeforeCommit: func() {
		close(frozen)
		<-wake
	}})
	euDone := make(chan error, 1)
	go func() {
		done, err := sendAs(paused, newTarget(t, c, false), "eu", topic, fromSource("eu", 1, fwdtest.OutboxBatch(10, fwdtest.SameKey)))
		if err == nil && done != 10 {
			err = errors.New("partial send without an error")
		}
		euDone <- err
	}()
	<-frozen
	if done, err := sendAs(outboxtest.Ctx(t), newTarget(t, c, false), "us", topic, fromSource("us", 1, fwdtest.OutboxBatch(5, fwdtest.SameKey))); done != 5 || err != nil {
		t.Fatalf("us: %d of 5, %v", done, err)
	}
	close(wake)
	if err := <-euDone; err != nil {
		t.Fatalf("eu's commit after us started: %v (fenced by another source?)", err)
	}
	if got := bySource(t, c, topic); got["eu"] != 10 || got["us"] != 5 {
		t.Fatalf("records by source: %v, want eu 10, us 5", got)
	}
}

// bareMarshaler writes the payload and no header at all, as a custom
// Marshaler may.
type bareMarshaler struct{}

func (bareMarshaler) Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	return &kgo.Record{Topic: topic, Value: msg.Payload}, nil
}

// Exactly once with a Marshaler that writes no headers: the target adds
// the ones the tail read needs, the source's included, so that a takeover
// of a named source still finds its own records.
func TestTakeoverOfASourceFindsItsRecordsWhateverTheMarshaler(t *testing.T) {
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 1, nil)
	send := func() {
		t.Helper()
		target := newTargetWith(t, kafka.Config{Brokers: c.Brokers, Marshaler: bareMarshaler{}})
		batch := fromSource("eu", 1, fwdtest.OutboxBatch(3, fwdtest.SameKey))
		if done, err := sendAs(outboxtest.Ctx(t), target, "eu", topic, batch); done != 3 || err != nil {
			t.Fatalf("eu: %d of 3, %v", done, err)
		}
	}
	send()
	send() // a new owner gets the batch again
	records := c.ReadCommitted(t, topic)
	if len(records) != 3 {
		t.Fatalf("%d records after a takeover, want 3 (the batch once)", len(records))
	}
	if src := kafkatest.Header(records[0], outbox.MetadataSource); src != "eu" {
		t.Fatalf("outbox_source header %q, want eu", src)
	}
}
